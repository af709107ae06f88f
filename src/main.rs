use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use clickhouse_operator::api::{self, ClickHouseCluster};
use clickhouse_operator::controller;
use clickhouse_operator::runtime::{
    self,
    leader::LeaderElector,
    metrics::{Health, Metrics},
    settings::Settings,
};
use tracing::{error, info};

#[derive(Parser)]
#[command(
    name = "clickhouse-operator",
    version,
    about = "A Kubernetes operator for ClickHouse"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator (configuration from the environment: WATCH_NAMESPACE,
    /// MAX_CONCURRENT_RECONCILES, LOG_FORMAT, LOG_LEVEL, HTTP_ADDR, LEADER_ELECTION,
    /// POD_NAME, POD_NAMESPACE, LEASE_NAME).
    Run,
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
    /// Show what the operator would decide for a ClickHouseCluster in a file, without a cluster.
    Plan {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", api::crd::yaml()),
        Command::Plan { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let cluster: ClickHouseCluster = serde_yaml::from_str(&text)
                .with_context(|| format!("{} is not a ClickHouseCluster", file.display()))?;
            let status = controller::cluster::offline_status(&cluster);
            print!(
                "{}",
                serde_yaml::to_string(&serde_json::json!({ "status": status }))?
            );
        }
        Command::Run => {
            let settings = Settings::from_env().map_err(anyhow::Error::msg)?;
            runtime::init_logging(settings.log_format, &settings.log_level);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            if let Err(e) = rt.block_on(run(settings)) {
                error!(error = format!("{e:#}"), "operator stopped");
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("cannot build a Kubernetes client (in-cluster config or KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    {
        let (addr, metrics, health) = (settings.http_addr, metrics.clone(), health.clone());
        tokio::spawn(async move {
            if let Err(e) = runtime::metrics::serve(addr, metrics, health).await {
                error!(error = %e, %addr, "metrics and health server stopped");
            }
        });
    }
    let lost = if settings.leader_election {
        let elector = LeaderElector::new(
            client.clone(),
            &settings.lease_namespace,
            &settings.lease_name,
            &settings.identity,
        );
        let mut rx = elector.acquire().await;
        futures::future::FutureExt::boxed(async move {
            while *rx.borrow() {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        })
    } else {
        info!("leader election is off: this replica acts alone");
        futures::future::FutureExt::boxed(futures::future::pending::<()>())
    };
    controller::run(&settings, client, metrics, health, lost).await
}
