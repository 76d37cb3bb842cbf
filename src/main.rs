use std::process::ExitCode;

use autonomic_manager::config::{self, Config, LogFormat};

/// The git revision this binary was built from (`+dirty`: with uncommitted changes), or
/// `AUTONOMIC_REVISION` as given to the build, or `unknown` (see build.rs).
const REVISION: &str = env!("AUTONOMIC_BUILD_REVISION");
/// The target triple it was built for.
const TARGET: &str = env!("AUTONOMIC_BUILD_TARGET");

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        None | Some("run") => {}
        Some("check") => return check(),
        Some("crds") => {
            print!("{}", autonomic_manager::crd::CRDS_YAML);
            return ExitCode::SUCCESS;
        }
        Some("version" | "--version") => {
            println!(
                "autonomic-manager {} (revision {REVISION}, {TARGET})",
                autonomic_manager::VERSION
            );
            return ExitCode::SUCCESS;
        }
        Some("help" | "--help" | "-h") => {
            print!("{}", config::usage());
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            let commands: Vec<&str> = config::COMMANDS.iter().map(|(c, _)| *c).collect();
            eprintln!(
                "autonomic-manager: unknown command {other:?} (commands: {}; see --help)",
                commands.join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("autonomic-manager: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(autonomic_manager::run(config, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "autonomic-manager failed");
            ExitCode::FAILURE
        }
    }
}

/// `autonomic-manager check`: one line a step on stdout; exit 0 when all passed, 1 when
/// one failed, 2 for a configuration the manager would refuse.
fn check() -> ExitCode {
    use autonomic_manager::check::{self, Line};
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("{}", Line::configuration_refused(&e));
            return ExitCode::from(2);
        }
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(runtime) = runtime(tokio::runtime::Builder::new_current_thread()) else {
        return ExitCode::FAILURE;
    };
    let passed = runtime.block_on(check::run(&config, &mut |line: &Line| println!("{line}")));
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The runtime `builder` makes, or `None` after saying why not.
fn runtime(mut builder: tokio::runtime::Builder) -> Option<tokio::runtime::Runtime> {
    match builder.enable_all().build() {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("autonomic-manager: unable to start the runtime: {e}");
            None
        }
    }
}

fn init_tracing(config: &Config) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // `Targets` reads the same `level,target=level` directives as EnvFilter without
    // EnvFilter's regex engine (about a megabyte of binary).
    // Checked by Config::parse (an invalid AUTONOMIC_LOG stops start-up there).
    let filter: tracing_subscriber::filter::Targets = match config.log_filter.parse() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("autonomic-manager: invalid configuration: AUTONOMIC_LOG: {e}");
            std::process::exit(2);
        }
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    match config.log_format {
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).init(),
        LogFormat::Text => registry.with(fmt.with_ansi(false)).init(),
    }
}

/// Completes on the first SIGTERM or SIGINT; a second one exits at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down (a second signal exits at once)");
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        std::process::exit(130);
    });
}
