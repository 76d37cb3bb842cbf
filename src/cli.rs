//! What the binary's commands need besides `run` itself: `check`, the commands that
//! only print, the runtime, logging and the shutdown signal.

use std::process::ExitCode;

use crate::check::{self, Line};
use crate::config::{self, Config, LogFormat};

/// `autonomic-manager check`: one line a step on stdout; exit 0 when all passed, 1 when
/// one failed, 2 for a configuration the manager would refuse.
pub fn check() -> ExitCode {
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

/// The commands that print and exit: `crds`, `help`, and any unknown one (exit 2).
pub fn print_command(command: &str) -> ExitCode {
    match command {
        "crds" => print!("{}", crate::crd::CRDS_YAML),
        "help" | "--help" | "-h" => print!("{}", config::usage()),
        other => {
            let commands: Vec<&str> = config::COMMANDS.iter().map(|(c, _)| *c).collect();
            eprintln!(
                "autonomic-manager: unknown command {other:?} (commands: {}; see --help)",
                commands.join(", ")
            );
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

/// The runtime `builder` makes, or `None` after saying why not.
pub fn runtime(mut builder: tokio::runtime::Builder) -> Option<tokio::runtime::Runtime> {
    match builder.enable_all().build() {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("autonomic-manager: unable to start the runtime: {e}");
            None
        }
    }
}

/// Logs to stderr, filtered by `AUTONOMIC_LOG` as [`Config::parse`] read it.
pub fn init_tracing(config: &Config) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(config.log_targets.clone());
    match config.log_format {
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).init(),
        LogFormat::Text => registry.with(fmt.with_ansi(false)).init(),
    }
}

/// Completes on the first SIGTERM or SIGINT; a second one exits at once.
pub async fn shutdown_signal() {
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
