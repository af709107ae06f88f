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
    /// Serve the metrics of every ClickHouse server and Keeper member of the watched clusters
    /// on HTTP_ADDR (`/metrics`); reads only, needs no leader (WATCH_NAMESPACE, LOG_FORMAT,
    /// LOG_LEVEL apply).
    Exporter,
    /// Back up or restore one shard (run by the operator in a Job beside the shard's backup
    /// replica; configuration from the environment the Job sets).
    BackupAgent,
    /// Show what applying a ClickHouseCluster file would do. With a kubeconfig it reads the
    /// running cluster (never writes) and exits 0 when nothing would change, 2 when something
    /// would, 1 when something is refused or invalid; without one (or with --offline) it shows
    /// the first pass over an empty namespace.
    Plan {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// `text` (default) or `json`.
        #[arg(short = 'o', long = "output", default_value = "text")]
        output: String,
        /// Do not read any cluster, even with a kubeconfig.
        #[arg(long)]
        offline: bool,
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
        Command::Plan {
            file,
            output,
            offline,
        } => {
            anyhow::ensure!(
                matches!(output.as_str(), "text" | "json"),
                "--output is text or json, not {output:?}"
            );
            let clusters = read_clusters(&file)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let client = if offline {
                None
            } else {
                rt.block_on(kube::Client::try_default()).ok()
            };
            let Some(client) = client else {
                for cluster in &clusters {
                    offline_plan(cluster)?;
                }
                return Ok(());
            };
            let mut code = 0;
            for cluster in &clusters {
                let p = rt
                    .block_on(controller::cluster::preview::preview(&client, cluster))
                    .map_err(|e| anyhow::anyhow!("reading the cluster: {e}"))?;
                if output == "json" {
                    write_stdout(&format!("{}\n", serde_json::to_string_pretty(&p)?))?;
                } else {
                    write_stdout(&p.human())?;
                }
                code = code.max(p.exit_code);
            }
            std::process::exit(code);
        }
        Command::Exporter => component(|settings, client| async move {
            info!(addr = %settings.http_addr, "exporter started");
            // EXPORTER_TOKEN: /metrics answers only with it as a bearer token
            let token = std::env::var("EXPORTER_TOKEN")
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty());
            // EXPORTER_CACHE_SECONDS: how long a scrape's answer is served again (default 10)
            let cache_for = match std::env::var("EXPORTER_CACHE_SECONDS") {
                Ok(v) if !v.trim().is_empty() => {
                    std::time::Duration::from_secs(v.trim().parse().map_err(|_| {
                        anyhow::anyhow!("EXPORTER_CACHE_SECONDS: {v:?} is not a number of seconds")
                    })?)
                }
                _ => clickhouse_operator::exporter::CACHE_FOR,
            };
            // EXPORTER_CREDENTIALS_SECRET: the one Secret (in its own namespace) the operator
            // publishes the clusters' exporter credentials in
            let credentials = settings.exporter_credentials.map(|name| {
                clickhouse_operator::exporter::CredentialsSecret {
                    namespace: settings.lease_namespace.clone(),
                    name,
                }
            });
            clickhouse_operator::exporter::serve(
                client,
                settings.watch_namespaces,
                credentials,
                settings.http_addr,
                token,
                cache_for,
            )
            .await?;
            Ok(())
        })?,
        Command::PvcCleaner => component(|settings, client| async move {
            info!("PVC cleaner started");
            if !settings.pvc_delete_key.shared {
                tracing::warn!(
                    "PVC_DELETE_KEY is not set: no PVC the operator hands over can be proven, so none is deleted"
                );
            }
            controller::pvc_cleaner::run(
                client,
                settings.watch_namespaces,
                settings.pvc_delete_key,
            )
            .await;
            Ok(())
        })?,
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

/// The ClickHouseClusters of a YAML file (other kinds skipped).
fn read_clusters(file: &std::path::Path) -> anyhow::Result<Vec<ClickHouseCluster>> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.get("kind").and_then(|k| k.as_str()) != Some("ClickHouseCluster") {
            continue;
        }
        out.push(
            serde_yaml::from_value(value).with_context(|| {
                format!("{} holds an invalid ClickHouseCluster", file.display())
            })?,
        );
    }
    anyhow::ensure!(
        !out.is_empty(),
        "{} holds no ClickHouseCluster",
        file.display()
    );
    Ok(out)
}

/// The first pass over an empty namespace, without any cluster.
fn offline_plan(cluster: &ClickHouseCluster) -> anyhow::Result<()> {
    let mut cluster = cluster.clone();
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
    }))?)
}

/// Runs a component beside the operator (`exporter`, `pvc-cleaner`): settings and logging from
/// the environment, a runtime, and a Kubernetes client (in-cluster config or KUBECONFIG).
fn component<F, Fut>(body: F) -> anyhow::Result<()>
where
    F: FnOnce(Settings, kube::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let settings = Settings::from_env().map_err(anyhow::Error::msg)?;
    runtime::init_logging(settings.log_format, &settings.log_level);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let client = kube::Client::try_default()
            .await
            .context("cannot build a Kubernetes client (in-cluster config or KUBECONFIG)")?;
        body(settings, client).await
    })
}
