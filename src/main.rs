use clap::{Parser, Subcommand};

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
    /// Print the CustomResourceDefinitions as YAML.
    Crd,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crd => print!("{}", clickhouse_operator::api::crd::yaml()),
    }
    Ok(())
}
