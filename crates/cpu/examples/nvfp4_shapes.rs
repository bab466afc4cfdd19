//! NVFP4 GEMM throughput at glm5-tiny's shapes: experts (256×256, 256×128 at 128 tokens) and the
//! dense MLP (1024×256, 256×512 at 512 tokens), 2 threads, the detected ISA, best of
//! `roofline::time_matmul`'s runs. `cargo run --release -p sparrow-cpu --example nvfp4_shapes`
use sparrow_cpu::format::nvfp4::Nvfp4Matrix;
use sparrow_cpu::{roofline, Isa, ThreadPool, Weight};

fn main() {
    let pool = ThreadPool::new(2).expect("pool");
    let isa = Isa::detect();
    for (rows, cols, tokens) in
        [(256usize, 256usize, 128usize), (256, 128, 128), (1024, 256, 512), (256, 512, 512), (256, 256, 512)]
    {
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 2001) as f32) / 1000.0 - 1.0).collect();
        let m = Weight::Nvfp4(Nvfp4Matrix::quantize(&w, rows, cols));
        let t = roofline::time_matmul(&pool, isa, &m, tokens);
        println!("{rows}x{cols} T={tokens}: {:.3} ms, {:.1} GMAC/s", t * 1e3, (rows * cols * tokens) as f64 / t / 1e9);
    }
}
