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
    /// Run the operator (configuration from the environment, listed below).
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
    /// running cluster (never writes); without one (or with --offline) it shows the first pass
    /// of a new cluster in an empty namespace.
    #[command(after_help = PLAN_EXIT_CODES)]
    Plan {
        /// The YAML file of ClickHouseClusters (other kinds are skipped); `-` reads standard
        /// input.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// `text` (default) or `json` (one JSON object per cluster).
        #[arg(short = 'o', long = "output", default_value = "text")]
        output: String,
        /// Do not read any cluster, even with a kubeconfig.
        #[arg(long)]
        offline: bool,
        /// The operator-level defaults file (the chart's `clusterDefaults`, the operator's
        /// `CLUSTER_DEFAULTS_FILE`), merged under each cluster's spec as the operator merges
        /// it; default: `CLUSTER_DEFAULTS_FILE` when set, else none.
        #[arg(long)]
        defaults: Option<PathBuf>,
    },
    /// Print every object the operator would create for the ClickHouseClusters of a file, as
    /// YAML: the ConfigMaps with the servers' and Keeper's configuration files, the users
    /// Secret with its files in `stringData` (placeholder passwords: the real ones are
    /// generated at creation), StatefulSets, Services, PodDisruptionBudgets, NetworkPolicies.
    /// Offline: reads no cluster and no Secret; what depends on the servers' version is left
    /// out, as on a new cluster's first pass.
    Render {
        /// The YAML file of ClickHouseClusters (other kinds are skipped); `-` reads standard
        /// input.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The operator-level defaults file, as for `plan`.
        #[arg(long)]
        defaults: Option<PathBuf>,
    },
    /// Print a completion script for a shell (bash, zsh, fish, elvish, powershell), e.g.
    /// `clickhouse-operator completions bash > /etc/bash_completion.d/clickhouse-operator`.
    Completions { shell: clap_complete::Shell },
}

/// The exit codes of `plan`, live and offline alike.
const PLAN_EXIT_CODES: &str =
    "Exit codes (for several clusters: 1 if any gives 1, else 2 if any gives 2):
  0  nothing would change
  1  something is refused or invalid (or the command line or the file is wrong)
  2  something would change";

/// Of two `plan` exit codes, the one a pipeline must see: a refusal (1) over a change (2) over
/// nothing (0).
fn worse(a: i32, b: i32) -> i32 {
    let rank = |c: i32| match c {
        1 => 2,
        2 => 1,
        _ => 0,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// The command line, with the environment `run` reads listed in its help.
fn cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let command =
        Cli::command().mut_subcommand("run", |run| run.after_help(runtime::settings::env_help()));
    command
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
        .unwrap_or_else(|e| {
            if !e.use_stderr() {
                e.exit() // --help, --version
            }
            // a wrong command line exits 1, as `plan` documents (2 means "would change")
            let _ = e.print();
            std::process::exit(1)
        })
}

fn main() -> anyhow::Result<()> {
    match cli().command {
        Command::Crd => write_stdout(&api::crd::yaml())?,
        Command::Render { file, defaults } => render(&file, defaults)?,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "clickhouse-operator", &mut out);
            write_stdout(&String::from_utf8_lossy(&out))?;
        }
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
            defaults,
        } => std::process::exit(plan(&file, &output, offline, defaults)?),
        Command::Exporter => component(exporter)?,
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
            let settings = settings_from_env()?;
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

/// `render`: the objects of the clusters of `file`, as YAML documents on stdout.
fn render(file: &std::path::Path, defaults: Option<PathBuf>) -> anyhow::Result<()> {
    let defaults = read_defaults(defaults)?;
    let mut text = String::new();
    for cluster in with_defaults(read_clusters(file)?, &defaults)? {
        let objects = controller::cluster::preview::render(&cluster).map_err(|e| {
            anyhow::anyhow!(
                "ClickHouseCluster {}: {e}",
                kube::ResourceExt::name_any(&cluster)
            )
        })?;
        for o in objects {
            text.push_str("---\n");
            text.push_str(&serde_yaml::to_string(&o)?);
        }
    }
    write_stdout(&text)
}

/// `plan`: what a pass would do to each cluster of `file`, on stdout; the exit code
/// ([`PLAN_EXIT_CODES`]).
fn plan(
    file: &std::path::Path,
    output: &str,
    offline: bool,
    defaults: Option<PathBuf>,
) -> anyhow::Result<i32> {
    anyhow::ensure!(
        matches!(output, "text" | "json"),
        "--output is text or json, not {output:?}"
    );
    let defaults = read_defaults(defaults)?;
    let clusters = read_clusters(file)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let client = if offline {
        None
    } else {
        rt.block_on(kube::Client::try_default()).ok()
    };
    // live, the preview merges the defaults under the running cluster's spec as well
    let clusters = if client.is_some() {
        clusters
    } else {
        with_defaults(clusters, &defaults)?
    };
    let mut code = 0;
    for cluster in &clusters {
        let p = match &client {
            Some(client) => rt
                .block_on(controller::cluster::preview::preview(
                    client, cluster, &defaults,
                ))
                .map_err(|e| anyhow::anyhow!("reading the cluster: {e}"))?,
            None => controller::cluster::preview::offline(cluster),
        };
        if output == "json" {
            write_stdout(&format!("{}\n", serde_json::to_string_pretty(&p)?))?;
        } else {
            write_stdout(&p.human())?;
        }
        code = worse(code, p.exit_code);
    }
    Ok(code)
}

/// `exporter`: serves the clusters' servers' metrics until a shutdown signal.
async fn exporter(settings: Settings, client: kube::Client) -> anyhow::Result<()> {
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
    // EXPORTER_METRIC_NAMES, EXPORTER_CLUSTER_LABEL: the names of ClickHouse's own
    // endpoint and the label `clickhouse_cluster`, on request
    let naming = clickhouse_operator::exporter::Naming::parse(
        std::env::var("EXPORTER_METRIC_NAMES").ok().as_deref(),
        std::env::var("EXPORTER_CLUSTER_LABEL").ok().as_deref(),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    clickhouse_operator::exporter::serve(
        client,
        settings.watch_namespaces,
        credentials,
        settings.http_addr,
        token,
        cache_for,
        naming,
    )
    .await?;
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
    let metrics = Arc::new(Metrics::new(settings.metrics_cluster_label));
    metrics.set_max_concurrent_reconciles(
        &[
            controller::cluster::KIND,
            controller::backup::KIND,
            controller::restore::KIND,
        ],
        settings.max_concurrent_reconciles,
    );
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

/// The ClickHouseClusters of a YAML file, or of standard input for `-` (other kinds skipped).
fn read_clusters(file: &std::path::Path) -> anyhow::Result<Vec<ClickHouseCluster>> {
    let stdin = file == std::path::Path::new("-");
    let source = if stdin {
        "standard input".to_string()
    } else {
        file.display().to_string()
    };
    let text = if stdin {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.get("kind").and_then(|k| k.as_str()) != Some("ClickHouseCluster") {
            continue;
        }
        out.push(
            serde_yaml::from_value(value)
                .with_context(|| format!("{source} holds an invalid ClickHouseCluster"))?,
        );
    }
    anyhow::ensure!(!out.is_empty(), "{source} holds no ClickHouseCluster");
    Ok(out)
}

/// Runs a component beside the operator (`exporter`, `pvc-cleaner`): settings and logging from
/// the environment, a runtime, and a Kubernetes client (in-cluster config or KUBECONFIG).
fn component<F, Fut>(body: F) -> anyhow::Result<()>
where
    F: FnOnce(Settings, kube::Client) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let settings = settings_from_env()?;
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

/// The settings from the environment, the operator-level defaults they read
/// (`CLUSTER_DEFAULTS_FILE`) checked: a wrong one stops the process at start, before it logs,
/// connects or waits for the leader lease.
fn settings_from_env() -> anyhow::Result<Settings> {
    let settings = Settings::from_env().map_err(anyhow::Error::msg)?;
    controller::cluster_defaults(&settings).map_err(anyhow::Error::msg)?;
    Ok(settings)
}

/// The operator-level defaults of `--defaults`, else of `CLUSTER_DEFAULTS_FILE`, else none.
fn read_defaults(
    path: Option<PathBuf>,
) -> anyhow::Result<clickhouse_operator::api::defaults::ClusterDefaults> {
    use clickhouse_operator::api::defaults::ClusterDefaults;
    let path = path.or_else(|| {
        std::env::var("CLUSTER_DEFAULTS_FILE")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| PathBuf::from(v.trim()))
    });
    let Some(path) = path else {
        return Ok(ClusterDefaults::default());
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("the defaults file {}: {e}", path.display()))?;
    ClusterDefaults::parse(&text)
        .map_err(|e| anyhow::anyhow!("the defaults file {}: {e}", path.display()))
}

/// Each cluster with the defaults merged under its spec, as the operator's passes see it (a
/// cluster read from a file has no volumes yet: it takes the default storage classes).
fn with_defaults(
    clusters: Vec<clickhouse_operator::api::ClickHouseCluster>,
    defaults: &clickhouse_operator::api::defaults::ClusterDefaults,
) -> anyhow::Result<Vec<clickhouse_operator::api::ClickHouseCluster>> {
    clusters
        .into_iter()
        .map(|mut c| {
            c.spec = defaults.apply(&c.spec).map_err(|e| {
                anyhow::anyhow!(
                    "the defaults under {}: {e}",
                    kube::ResourceExt::name_any(&c)
                )
            })?;
            let classes = defaults.storage_classes();
            Ok(clickhouse_operator::plan::storage_classes::with_classes(&c, &classes).into_owned())
        })
        .collect()
}
