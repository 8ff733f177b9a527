//! `pocketmoe-serve`: the OpenAI-compatible server (issue "pocketmoe-serve"). Not built yet: it
//! says so and exits non-zero rather than pretending to serve.
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "pocketmoe-serve",
    version,
    about = "OpenAI-compatible server for PocketMoE (not implemented yet)"
)]
struct Args {
    /// GGUF model to serve.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
}

fn main() {
    let _ = Args::parse();
    eprintln!(
        "error: pocketmoe-serve is not implemented yet; `pocketmoe self-check` is what works today"
    );
    std::process::exit(2);
}
