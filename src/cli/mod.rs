//! Implementations of the `pocketmoe` subcommands (the binary only parses arguments).
pub mod bench;
pub mod inspect;
pub mod run;
pub mod synth;

/// A progress bar over bytes, on stderr (hidden when stderr is not a terminal).
pub fn byte_progress(total: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}
