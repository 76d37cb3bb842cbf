use std::process::ExitCode;

use autonomic_manager::cli;
use autonomic_manager::config::Config;

/// The git revision this binary was built from (`+dirty`: with uncommitted changes), or
/// `AUTONOMIC_REVISION` as given to the build, or `unknown` (see build.rs).
const REVISION: &str = env!("AUTONOMIC_BUILD_REVISION");
/// The target triple it was built for.
const TARGET: &str = env!("AUTONOMIC_BUILD_TARGET");

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        None | Some("run") => run(),
        Some("check") => cli::check(),
        Some("version" | "--version") => {
            let version = autonomic_manager::VERSION;
            println!("autonomic-manager {version} (revision {REVISION}, {TARGET})");
            ExitCode::SUCCESS
        }
        Some(other) => cli::print_command(other),
    }
}

/// `autonomic-manager run`: exit 2 for a configuration it refuses, 1 when it fails.
fn run() -> ExitCode {
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("autonomic-manager: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    cli::init_tracing(&config);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(runtime) = cli::runtime(tokio::runtime::Builder::new_multi_thread()) else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(autonomic_manager::run(config, cli::shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "autonomic-manager failed");
            ExitCode::FAILURE
        }
    }
}
