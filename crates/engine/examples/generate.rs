//! Greedy generation from token ids, for quick manual checks and timing:
//! `cargo run --release -p sparrow-engine --example generate -- MODEL.gguf 32 1 2 3`
//! (model, new tokens, prompt ids). Prints the generated ids and the decode rate.

use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;
use sparrow_engine::sampler::argmax;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: generate MODEL N IDS...")?;
    let n: usize = args.get(2).ok_or("usage")?.parse()?;
    let mut ids: Vec<u32> = args[3..].iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
    let threads = std::env::var("THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let mut m = LlamaModel::load(std::path::Path::new(path), threads)?;
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 4096);
    let mut kv_len = 0usize;
    let mut out = Vec::new();
    let mut t0 = std::time::Instant::now();
    for step in 0..n {
        let new = ids.len() - kv_len;
        let b = ForwardBatch::single_sequence(&ids, kv_len);
        let logits = m.forward(&b, &mut kv)?;
        kv_len = ids.len();
        let t = argmax(&logits);
        ids.push(t);
        out.push(t);
        if step == 0 {
            eprintln!("prefill of {new} tokens: {:?}", t0.elapsed());
            t0 = std::time::Instant::now();
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    println!("{out:?}");
    eprintln!("decode: {} tokens in {dt:.3}s = {:.1} tok/s", n - 1, (n - 1) as f64 / dt);
    Ok(())
}
