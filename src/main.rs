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
use serde::Deserialize;
use tracing::{error, info};

#[derive(Parser)]
#[command(
    name = "clickhouse-operator",
    version = api::validate::OPERATOR_VERSION,
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
    /// Run only the PVC cleaner: delete PVCs labelled clickhouse.com/delete-pvc once no pod
    /// uses them (WATCH_NAMESPACE, LOG_FORMAT, LOG_LEVEL apply).
    PvcCleaner,
    /// Back up or restore one shard (run by the operator in a Job beside the shard's backup
    /// replica; configuration from the environment the Job sets).
    BackupAgent,
    /// Show what the operator would decide for a ClickHouseCluster in a file, without a cluster.
    Plan {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => write_stdout(&api::crd::yaml())?,
        Command::BackupAgent => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let code = rt.block_on(clickhouse_operator::backup::agent::main_from_env());
            std::process::exit(code);
        }
        Command::Plan { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let docs = serde_yaml::Deserializer::from_str(&text);
            let mut found = false;
            for doc in docs {
                let value = serde_yaml::Value::deserialize(doc)?;
                if value.get("kind").and_then(|k| k.as_str()) != Some("ClickHouseCluster") {
                    continue;
                }
                found = true;
                let mut cluster: ClickHouseCluster =
                    serde_yaml::from_value(value).with_context(|| {
                        format!("{} holds an invalid ClickHouseCluster", file.display())
                    })?;
                // Not read from an API server: give it what the server would.
                let meta = &mut cluster.metadata;
                meta.namespace.get_or_insert_with(|| "default".into());
                meta.uid
                    .get_or_insert_with(|| "00000000-0000-0000-0000-000000000000".into());
                meta.generation.get_or_insert(1);
                let plan = controller::cluster::offline_plan(&cluster);
                let actions: Vec<String> = plan.actions.iter().map(|a| a.describe()).collect();
                write_stdout(&serde_yaml::to_string(&serde_json::json!({
                    "cluster": cluster.metadata.name,
                    "actions": actions,
                    "status": plan.status,
                }))?)?;
            }
            anyhow::ensure!(found, "{} holds no ClickHouseCluster", file.display());
        }
        Command::PvcCleaner => {
            let settings = Settings::from_env().map_err(anyhow::Error::msg)?;
            runtime::init_logging(settings.log_format, &settings.log_level);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let client = kube::Client::try_default().await.context(
                    "cannot build a Kubernetes client (in-cluster config or KUBECONFIG)",
                )?;
                info!("PVC cleaner started");
                controller::pvc_cleaner::run(client, settings.watch_namespaces).await;
                anyhow::Ok(())
            })?;
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
    info!(
        version = api::validate::OPERATOR_VERSION,
        "operator starting"
    );
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
    // A standby is healthy and ready too: it serves metrics and waits to take over.
    health
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
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

/// Writes `text` to standard output; a reader that went away (`crd | head`) ends the output
/// quietly instead of failing.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
