//! `pocketmoe tokenize`: a GGUF's tokenizer on a text, as the server's `/tokenize`.
use crate::gguf::GgufModel;
use crate::tokenizer::Tokenizer;
use anyhow::{Context as _, Result};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// The GGUF model whose tokenizer to use.
    #[arg(short, long)]
    pub model: PathBuf,
    /// The text to tokenize.
    pub text: String,
    /// Print one `ID<TAB>PIECE` line per token instead of the ids.
    #[arg(long)]
    pub pieces: bool,
    /// Add BOS/EOS as the model does.
    #[arg(long)]
    pub add_special: bool,
    /// Keep control-token text as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let file = GgufModel::open(&args.model)
        .with_context(|| format!("reading {}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = tok.encode(&args.text, args.add_special, !args.no_parse_special);
    if args.pieces {
        for id in ids {
            let piece = String::from_utf8_lossy(&tok.token_to_piece(id)).into_owned();
            println!("{id}\t{piece:?}");
        }
    } else {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("[{}]", ids.join(", "));
    }
    Ok(())
}
