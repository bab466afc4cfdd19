//! The `sparrow` binary: `sparrow serve` (the inference server), `sparrow bench` (the
//! benchmark client), `sparrow sweep` (bench steps against servers it may launch),
//! `gen-model` / `quantize` / `perplexity` / `export-tokenizer` (`offline`, over `sparrow-convert`),
//! and a hidden `sparrow mock-server` for trying the client without a model.

mod offline;
mod roofline;
mod serve;

use std::net::SocketAddr;

use clap::{Parser, Subcommand};
use sparrow_bench::args::BenchArgs;
use sparrow_bench::mock::MockScript;
use sparrow_bench::run::{self, exit};

/// The system allocator with the per-thread budget the start-up chat-template check arms
/// (`sparrow_cpu::guard`): a template that builds a huge string ends start-up with a
/// message instead of taking the machine's memory.
#[global_allocator]
static ALLOC: sparrow_cpu::guard::GuardedAlloc = sparrow_cpu::guard::GuardedAlloc;

#[derive(Debug, Parser)]
#[command(name = "sparrow", version, about = "Sparrow: an LLM serving stack")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model (a GGUF file or a Hugging Face checkpoint directory of an architecture in
    /// docs/serve.md's table) over OpenAI, Anthropic and SGLang-native HTTP APIs (flags as
    /// `python -m sglang.launch_server`).
    // argparse semantics, as `launch_server`: a repeated flag takes its last value, a long
    // flag may be abbreviated to a unique prefix, and `-1` is a value (`--chunked-prefill-size -1`).
    #[command(args_override_self = true, infer_long_args = true, allow_negative_numbers = true)]
    Serve(Box<serve::ServeArgs>),
    /// Benchmark a running server (flags as `python -m sglang.bench_serving`).
    Bench(Box<BenchArgs>),
    /// Sweep `sparrow bench` over concurrency or request-rate steps: launched servers, kept
    /// logs, crash verdicts, knee, A/B runs, report (`sparrow sweep --help`).
    #[command(disable_help_flag = true)]
    Sweep {
        /// The sweep's flags and every `sparrow bench` flag.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Write a toy checkpoint (`glm5-tiny`) in the ModelOpt NVFP4 format.
    GenModel(offline::GenModelArgs),
    /// Convert a GGUF file or a BF16/F32 safetensors checkpoint to ModelOpt NVFP4.
    Quantize(offline::QuantizeArgs),
    /// Perplexity of a model on ShareGPT replies.
    Perplexity(offline::PerplexityArgs),
    /// Measure this machine's limits (clock, bandwidth, 8-bit and f32 peaks per ISA path), the
    /// model's decode rooflines, and what the matmul kernels reach against them.
    Roofline(roofline::RooflineArgs),
    /// Write a model's tokenizer as a Hugging Face tokenizer directory (for other clients).
    ExportTokenizer(offline::ExportTokenizerArgs),
    // `sparrow bench merge`, reached through `sparrow bench merge ...` (see `parse_cli`).
    #[command(
        name = "bench-merge",
        hide = true,
        about = "Merge the records files of a multi-client `sparrow bench` run into one report",
        override_usage = "sparrow bench merge [OPTIONS] <FILES>..."
    )]
    BenchMerge(sparrow_bench::merge::MergeArgs),
    /// A scripted OpenAI/SGLang-compatible server for testing the client.
    #[command(hide = true)]
    MockServer {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:30000")]
        listen: SocketAddr,
        #[command(flatten)]
        script: MockScript,
    },
}

/// Why a command line stops before anything runs.
#[derive(Debug)]
enum CliError {
    /// clap's own: usage errors (exit status 2), and --help / --version (0).
    Clap(clap::Error),
    /// An SGLang flag or value refused by name, or an ambiguous abbreviation (exit status 2).
    Refused(String),
}

/// Parses a whole command line (`argv[0]` included) as `main` does, starting nothing: the
/// checks SGLang's argparse makes that clap cannot (refused SGLang flags, ambiguous prefixes)
/// first, then clap, then the SGLang values sparrow serve refuses.
fn parse_cli(argv: &[String]) -> Result<Cli, CliError> {
    let rest = argv.get(2..).unwrap_or_default();
    // `sparrow bench merge FILES...` is its own command line: bench's flags (parsed with
    // argparse's prefix rule) would otherwise read `merge` as a stray value.
    if argv.get(1).map(String::as_str) == Some("bench") && rest.first().map(String::as_str) == Some("merge") {
        let mut v = vec![argv[0].clone(), "bench-merge".to_owned()];
        v.extend_from_slice(&rest[1..]);
        return Cli::try_parse_from(v).map_err(CliError::Clap);
    }
    match argv.get(1).map(String::as_str) {
        Some("bench") => {
            if let Some(e) = sparrow_bench::args::ambiguous_flag(rest) {
                return Err(CliError::Refused(e));
            }
        }
        Some("serve") => serve::check_argv(rest).map_err(CliError::Refused)?,
        _ => {}
    }
    let cli = Cli::try_parse_from(argv).map_err(CliError::Clap)?;
    if let Command::Serve(a) = &cli.command {
        a.check().map_err(CliError::Refused)?;
    }
    Ok(cli)
}

fn main() -> std::process::ExitCode {
    // Before any thread exists: forward passes reuse their freed activation memory.
    sparrow_cpu::mem::retain_freed_memory();
    let argv: Vec<String> = std::env::args().collect();
    let cli = match parse_cli(&argv) {
        Ok(cli) => cli,
        Err(CliError::Clap(e)) => e.exit(),
        Err(CliError::Refused(e)) => {
            sparrow_bench::errln!("error: {e}");
            return std::process::ExitCode::from(exit::SETUP as u8);
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // `--rust-worker-threads` sizes the bench's runtime, as it sizes SGLang's Rust client's.
    if let Command::Bench(a) = &cli.command {
        if let Some(n) = a.rust_worker_threads.filter(|&n| n > 0) {
            builder.worker_threads(n);
        }
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            sparrow_bench::errln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(exit::SETUP as u8);
        }
    };
    let code = rt.block_on(async move {
        match cli.command {
            Command::Serve(args) => match serve::serve(*args).await {
                Ok(()) => 0,
                Err(e) => {
                    sparrow_bench::errln!("error: {e:#}");
                    exit::SETUP
                }
            },
            Command::Bench(args) => bench(*args).await,
            Command::Sweep { args } => sweep(args).await,
            Command::GenModel(a) => blocking(move || offline::gen_model(&a)).await,
            Command::Quantize(a) => blocking(move || offline::quantize(&a)).await,
            Command::Perplexity(a) => blocking(move || offline::perplexity(&a)).await,
            Command::ExportTokenizer(a) => blocking(move || offline::export_tokenizer(&a)).await,
            Command::Roofline(a) => blocking(move || roofline::roofline(&a)).await,
            Command::BenchMerge(a) => match sparrow_bench::merge::run_merge(&a) {
                Ok(code) => code,
                Err(e) => {
                    sparrow_bench::errln!("error: {e}");
                    exit::SETUP
                }
            },
            Command::MockServer { listen, script } => mock(listen, script).await,
        }
    });
    std::process::ExitCode::from(code.clamp(0, 255) as u8)
}

/// Runs a CPU-bound tool off the async runtime; errors exit with the set-up status.
async fn blocking(f: impl FnOnce() -> anyhow::Result<()> + Send + 'static) -> i32 {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            sparrow_bench::errln!("error: {e:#}");
            exit::SETUP
        }
        Err(e) => {
            sparrow_bench::errln!("error: {e}");
            exit::SETUP
        }
    }
}

async fn bench(args: BenchArgs) -> i32 {
    let cfg = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            sparrow_bench::errln!("error: {e}");
            return exit::SETUP;
        }
    };
    match run::run(cfg).await {
        Ok(outcome) => {
            sparrow_bench::errln!(
                "results appended to {}; per-request records in {}",
                outcome.output_file.display(),
                outcome.details_file.display()
            );
            outcome.exit_code
        }
        Err(e) => {
            sparrow_bench::errln!("error: {e}");
            e.exit_code()
        }
    }
}

async fn sweep(args: Vec<String>) -> i32 {
    use sparrow_sweep::args::ParseError;
    let cfg = match sparrow_sweep::args::parse(&args) {
        Ok(c) => c,
        Err(ParseError::Help(h)) => {
            sparrow_bench::outln!("{h}");
            return 0;
        }
        Err(ParseError::Flags(e)) => {
            sparrow_bench::errln!("error: {e}");
            return exit::SETUP;
        }
    };
    let sweep = match sparrow_sweep::sweep::Sweep::new(cfg, args) {
        Ok(s) => s,
        Err(e) => {
            sparrow_bench::errln!("error: {e}");
            return exit::SETUP;
        }
    };
    match sweep.run().await {
        Ok(code) => code,
        Err(e) => {
            sparrow_bench::errln!("error: {e}");
            exit::SETUP
        }
    }
}

async fn mock(listen: SocketAddr, script: MockScript) -> i32 {
    let server = match sparrow_bench::mock::start(listen, script).await {
        Ok(s) => s,
        Err(e) => {
            sparrow_bench::errln!("error: cannot listen on {listen}: {e}");
            return exit::SETUP;
        }
    };
    sparrow_bench::errln!("mock server listening on {}", server.url());
    tokio::select! {
        () = server.died() => {
            sparrow_bench::errln!("mock server: scripted death");
            1
        }
        _ = tokio::signal::ctrl_c() => 0,
    }
}
