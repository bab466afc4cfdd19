//! MoE expert tensors as llama.cpp writes them (`blk.N.ffn_{gate,up,down}_exps`: one 3-D tensor
//! `[cols, rows, n_expert]` per projection) read back as one weight per expert, for a block
//! type and a 16-bit type: each expert's rows equal the file's bytes of that expert decoded by
//! the reference dequantizer, and a tensor whose expert count or shape disagrees is a start-up
//! error naming it.

use crate::formats::{encode, ggml, Lcg};
use ggus::{GGufFileHeader, GGufFileWriter, GGufMetaDataValueType as Ty};
use sparrow_cpu::format::ggml::{dequantize_row, GgmlType};
use sparrow_engine::checkpoint::gguf::GgufFile;

const COLS: usize = 64;
const ROWS: usize = 6;
const EXPERTS: usize = 3;

#[test]
fn expert_tensors_split_into_one_weight_per_expert() {
    let dir = std::env::temp_dir().join(format!("sparrow-moe-tensors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("experts.gguf");
    let mut rng = Lcg(7);
    let types = [GgmlType::Q8_0, GgmlType::F16];
    let tensors: Vec<(String, GgmlType, Vec<u8>)> = types
        .iter()
        .enumerate()
        .map(|(i, &ty)| {
            let x: Vec<f32> = (0..EXPERTS * ROWS * COLS).map(|_| rng.f(0.5)).collect();
            (format!("blk.{i}.ffn_up_exps.weight"), ty, encode(ty, &x))
        })
        .collect();
    let meta = [("general.architecture", Ty::String, [&(5u64.to_le_bytes())[..], b"llama"].concat())];
    let file = std::fs::File::create(&path).expect("create");
    let header = GGufFileHeader::new(3, tensors.len() as u64, meta.len() as u64);
    let mut w = GGufFileWriter::new(std::io::BufWriter::new(file), header).expect("header");
    for (k, ty, v) in &meta {
        w.write_meta_kv(k, *ty, v).expect("meta");
    }
    let mut tw = w.finish::<Vec<u8>>(true);
    for (name, ty, bytes) in &tensors {
        tw.write_tensor(name, ggml(*ty), &[COLS as u64, ROWS as u64, EXPERTS as u64], bytes.clone()).expect("tensor");
    }
    tw.finish().expect("write");

    let f = GgufFile::open(&path).expect("open");
    let g = f.view().expect("view");
    for (name, ty, bytes) in &tensors {
        let experts = g.experts(name, EXPERTS, ROWS, COLS, 2).expect("experts");
        assert_eq!(experts.len(), EXPERTS);
        let row_bytes = ty.bytes_for(COLS);
        for (e, w) in experts.iter().enumerate() {
            assert_eq!((w.rows(), w.cols()), (ROWS, COLS));
            for r in 0..ROWS {
                let at = (e * ROWS + r) * row_bytes;
                let mut want = vec![0f32; COLS];
                dequantize_row(*ty, &bytes[at..at + row_bytes], &mut want);
                let mut got = vec![0f32; COLS];
                w.row_f32(r, &mut got);
                assert_eq!(got, want, "{name} expert {e} row {r}");
            }
        }
        // Another expert count (metadata that disagrees with the file) names the tensor.
        let err = g.experts(name, EXPERTS + 1, ROWS, COLS, 1).expect_err("a shape error").to_string();
        assert!(err.contains(name.as_str()) && err.contains("4 experts"), "{err}");
        let err = g.experts(name, EXPERTS, ROWS + 1, COLS, 1).expect_err("a shape error").to_string();
        assert!(err.contains(name.as_str()), "{err}");
    }
    assert!(g.experts("blk.9.ffn_up_exps.weight", EXPERTS, ROWS, COLS, 1).is_err(), "a missing tensor");
    let _ = std::fs::remove_dir_all(dir);
}

/// A GGUF file written byte by byte (`ggus`' writer has no MXFP4): `tensors` of
/// `(name, GGML type number, shape innermost first, bytes)`, 32-byte alignment.
fn raw_gguf(tensors: &[(&str, u32, Vec<u64>, Vec<u8>)]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(b"GGUF");
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    f.extend_from_slice(&1u64.to_le_bytes());
    let (k, v) = ("general.architecture", "llama");
    f.extend_from_slice(&(k.len() as u64).to_le_bytes());
    f.extend_from_slice(k.as_bytes());
    f.extend_from_slice(&8u32.to_le_bytes()); // string
    f.extend_from_slice(&(v.len() as u64).to_le_bytes());
    f.extend_from_slice(v.as_bytes());
    let mut offset = 0u64;
    for (name, ty, shape, bytes) in tensors {
        f.extend_from_slice(&(name.len() as u64).to_le_bytes());
        f.extend_from_slice(name.as_bytes());
        f.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        shape.iter().for_each(|d| f.extend_from_slice(&d.to_le_bytes()));
        f.extend_from_slice(&ty.to_le_bytes());
        f.extend_from_slice(&offset.to_le_bytes());
        offset += (bytes.len() as u64).next_multiple_of(32);
    }
    for (_, _, _, bytes) in tensors {
        while f.len() % 32 != 0 {
            f.push(0);
        }
        f.extend_from_slice(bytes);
    }
    f
}

/// gpt-oss's MXFP4 experts (GGML type 39, which `ggus`' own index cannot decode) read as one
/// weight per expert equal to GGML's dequantization; a block scale the tiles cannot keep (a
/// subnormal one), and a
/// type sparrow does not read, are start-up errors naming the tensor.
#[test]
fn mxfp4_experts_read_and_unreadable_tensors_are_named() {
    let dir = std::env::temp_dir().join(format!("sparrow-mxfp4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("mxfp4.gguf");
    let mut x = 11u32;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let good = sparrow_cpu::format::ggml::random_blocks(GgmlType::MXFP4, EXPERTS * ROWS * COLS, &mut next);
    let mut bad = good.clone();
    bad[17 * 3] = 1; // scale 2^-127, subnormal
    let shape = vec![COLS as u64, ROWS as u64, EXPERTS as u64];
    let file = raw_gguf(&[
        ("blk.0.ffn_down_exps.weight", 39, shape.clone(), good.clone()),
        ("blk.1.ffn_down_exps.weight", 39, shape.clone(), bad),
        ("blk.2.ffn_down_exps.weight", 23, vec![256, 1], vec![0u8; 136]),
    ]);
    std::fs::write(&path, file).expect("write");
    let f = GgufFile::open(&path).expect("open");
    let g = f.view().expect("an index past ggus' types");
    let experts = g.experts("blk.0.ffn_down_exps.weight", EXPERTS, ROWS, COLS, 2).expect("experts");
    let row_bytes = GgmlType::MXFP4.bytes_for(COLS);
    for (e, w) in experts.iter().enumerate() {
        for r in 0..ROWS {
            let at = (e * ROWS + r) * row_bytes;
            let mut want = vec![0f32; COLS];
            dequantize_row(GgmlType::MXFP4, &good[at..at + row_bytes], &mut want);
            let mut got = vec![0f32; COLS];
            w.row_f32(r, &mut got);
            assert_eq!(got, want, "expert {e} row {r}");
        }
    }
    let err = g.experts("blk.1.ffn_down_exps.weight", EXPERTS, ROWS, COLS, 1).expect_err("refused").to_string();
    assert!(err.contains("blk.1.ffn_down_exps.weight") && err.contains("2^-127"), "{err}");
    let err = g.matrix_threads("blk.2.ffn_down_exps.weight", 1, 256, 1).expect_err("refused").to_string();
    assert!(err.contains("blk.2.ffn_down_exps.weight") && err.contains("type 23"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
