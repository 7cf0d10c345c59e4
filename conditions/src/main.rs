//! serving-picker-conditions: EndpointSlices -> endpoint conditions for Envoy.
//!
//! `serving-picker-conditions eds --listen ADDR:PORT --cluster NAME=NAMESPACE/SERVICE:PORT_NAME
//! [--cluster ...] [--slices-dir DIR] [--tls-cert FILE --tls-key FILE [--client-ca FILE
//! [--client-san NAME ...]]]`: an xDS (EDS/ADS) server; without
//! `--slices-dir` it watches the Kubernetes API (in-cluster config, or
//! KUBECONFIG / ~/.kube/config).
//!
//! `serving-picker-conditions envoy-gateway --listen ADDR:PORT [--manage SELECTOR]
//! [--slices-dir DIR] [--flat-output] [--native-lb-policy]`: Envoy Gateway's extension hooks
//! (`envoy_gateway`).
//!
//! `serving-picker-conditions preflight [--mode eds|envoy-gateway|istio] [--kubeconfig FILE]`:
//! checks a cluster before installing (`preflight`).

use clap::{Parser, Subcommand, ValueEnum};

use serving_picker_conditions::{envoy_gateway, preflight, run};

#[derive(Parser, Debug)]
#[command(
    name = "serving-picker-conditions",
    version = build_version(),
    about = "Watches EndpointSlices and gives Envoy each endpoint's exact conditions"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve EDS (gRPC, state of the world, ADS or plain EDS) to Envoy.
    Eds(run::eds::Args),
    /// Answer Envoy Gateway's PostEndpointsModify hook (an EG extension server).
    EnvoyGateway(envoy_gateway::Args),
    /// Check a cluster before installing: API, RBAC, CRDs, Envoy Gateway's
    /// settings, certificates, labelled Services; prints each fix (exit 1 on
    /// a failed check).
    Preflight(preflight::gather::Args),
}

/// `0.1.0 (commit …)`: the version and the commit this binary was built from
/// (`serving_picker_core::build_info`), what `--version` prints after the name.
fn build_version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| serving_picker_core::build_identity!().to_string())
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("serving-picker-conditions: tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let limits = match &cli.command {
        Command::Eds(args) => Some(&args.limits),
        Command::EnvoyGateway(args) => Some(&args.limits),
        Command::Preflight(_) => None,
    };
    if let Some(limits) = limits {
        tracing::info!("serving-picker-conditions {} starting", build_version());
        run::raise_fd_limit(limits);
    }
    // Ok(false): ran, and found the cluster not ready (preflight).
    let result = rt.block_on(async {
        match cli.command {
            Command::Eds(args) => run::eds::run(args, shutdown_signal()).await.map(|()| true),
            Command::EnvoyGateway(args) => run::envoy_gateway::run(args, shutdown_signal())
                .await
                .map(|()| true),
            Command::Preflight(args) => preflight::run(args).await,
        }
    });
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "serving-picker-conditions failed");
            eprintln!("serving-picker-conditions: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
