//! BERT-family encoders for embeddings and pair scoring (Devlin et al. 2019; HF
//! `models/bert/modeling_bert.py`, sentence-transformers' `Transformer` → `Pooling` →
//! `Normalize` modules).
//!
//! The layer is post-LayerNorm: `x = LN(x + Attn(x))`, `x = LN(x + W₂·GELU(W₁·x))`, with
//! bidirectional multi-head attention over the whole sequence, absolute learned position
//! embeddings and token-type (segment) embeddings added to the word embeddings before a first
//! LayerNorm. Every projection has a bias. GELU is the exact (erf) form HF's `"gelu"` names.
//!
//! In the engine an encoder is an ordinary [`Model`]: its keys and values go into the paged KV
//! store at the batch's slots (so the pool accounts for it as for a decoder), and each query
//! attends to every slot of its own sequence. Because no token may be computed before the
//! sequence's last one is known, the engine sends whole sequences
//! ([`AttentionNeeds::whole_sequences`]): no chunked prefill, no radix prefix.
//!
//! Two heads:
//! - an embedding model (`BertModel`, as sentence-transformers ships it): the sequence's final
//!   hidden states pooled by `1_Pooling/config.json` (mean, CLS or last token);
//! - a cross-encoder (`BertForSequenceClassification`): `classifier(tanh(pooler(h_CLS)))`, the
//!   pair `[CLS] a [SEP] b [SEP]` scored jointly; segment ids are 0 up to and including the first
//!   `[SEP]` and 1 after it, which is exactly what the tokenizer's pair template writes.

use std::path::Path;

use serde_json::Value;
use sparrow_cpu::{Isa, ThreadPool, Weight};

use super::linear::{Fwd, Linear};
use super::vb::{Tensors, Vb};
use super::{AttentionNeeds, EmbeddingSpec, Instruments, Model, ModelInfo, PartTimes, Pooling};
use crate::batch::ForwardBatch;
use crate::checkpoint::hf::{read_json, Checkpoint};
use crate::kv::{KvDtype, KvLayout, KvStore};
use crate::EngineError;

/// The hyper-parameters of a BERT checkpoint (`config.json`, HF `BertConfig`) and the
/// sentence-transformers modules beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// FFN width.
    pub intermediate: usize,
    /// Rows of the position-embedding table.
    pub max_positions: usize,
    /// Longest input served: sentence-transformers' `max_seq_length` when the checkpoint has
    /// `sentence_bert_config.json`, else `max_positions`.
    pub max_len: usize,
    /// Rows of the token-type table.
    pub type_vocab: usize,
    /// LayerNorm ε.
    pub eps: f32,
    /// How embeddings are pooled (`1_Pooling/config.json`; CLS without one, as HF's
    /// `BertModel` pooler reads the CLS token).
    pub pooling: Pooling,
    /// Output labels of a sequence-classification head (a cross-encoder), if any.
    pub num_labels: Option<usize>,
    /// The `[SEP]` id that ends segment A of a pair (from `tokenizer.json`).
    pub sep_id: Option<u32>,
}

impl BertConfig {
    /// Reads `dir`'s `config.json`, `sentence_bert_config.json`, `modules.json` with its
    /// pooling module's `config.json`, and the `[SEP]` id from `tokenizer.json`.
    ///
    /// # Errors
    /// A missing or malformed `config.json`, a field out of range, a hidden activation other
    /// than `gelu` or a position embedding other than `absolute`, a pooling mode we lack.
    pub fn read(dir: &Path) -> Result<BertConfig, EngineError> {
        let cfg = read_json(&dir.join("config.json"))?;
        let err = |m: String| EngineError::model(format!("{}: {m}", dir.join("config.json").display()));
        let empty = serde_json::Map::new();
        let num = |k: &str| positive(cfg.as_object().unwrap_or(&empty), k, "", &dir.join("config.json"));
        let act = cfg.get("hidden_act").and_then(Value::as_str).unwrap_or("gelu");
        if act != "gelu" {
            return Err(err(format!("hidden_act {act:?}: only \"gelu\" (erf) is implemented")));
        }
        let pe = cfg.get("position_embedding_type").and_then(Value::as_str).unwrap_or("absolute");
        if pe != "absolute" {
            return Err(err(format!("position_embedding_type {pe:?}: only \"absolute\" is implemented")));
        }
        let (hidden, heads) = (num("hidden_size")?, num("num_attention_heads")?);
        if hidden % heads != 0 {
            return Err(err(format!("hidden_size {hidden} is not a multiple of num_attention_heads {heads}")));
        }
        let max_positions = num("max_position_embeddings")?;
        let st_len = std::fs::read_to_string(dir.join("sentence_bert_config.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .and_then(|v| v.get("max_seq_length").and_then(Value::as_u64))
            .map(|v| v as usize);
        let archs: Vec<String> = cfg
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let classifier = archs.iter().any(|a| a.ends_with("ForSequenceClassification"));
        let num_labels = classifier.then(|| {
            cfg.get("id2label")
                .and_then(Value::as_object)
                .map(|m| m.len())
                .or_else(|| cfg.get("num_labels").and_then(Value::as_u64).map(|v| v as usize))
                .unwrap_or(2)
        });
        Ok(BertConfig {
            vocab: num("vocab_size")?,
            hidden,
            layers: num("num_hidden_layers")?,
            heads,
            intermediate: num("intermediate_size")?,
            max_positions,
            max_len: st_len.unwrap_or(max_positions).min(max_positions),
            type_vocab: cfg.get("type_vocab_size").and_then(Value::as_u64).unwrap_or(2) as usize,
            eps: cfg.get("layer_norm_eps").and_then(Value::as_f64).unwrap_or(1e-12) as f32,
            pooling: read_pooling(dir)?,
            num_labels,
            sep_id: sep_id(dir),
        })
    }

    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
}

/// The positive integer `key` of `m` (a `config.json`, or a GGUF file's `{arch}.*` keys with
/// `prefix` naming them).
///
/// # Errors
/// A missing key or one that is not a positive integer, naming `file` and the key.
fn positive(m: &serde_json::Map<String, Value>, key: &str, prefix: &str, file: &Path) -> Result<usize, EngineError> {
    m.get(key).and_then(Value::as_u64).map(|v| v as usize).filter(|&v| v > 0).ok_or_else(|| {
        EngineError::model(format!("{}: {prefix}{key}: missing or not a positive integer", file.display()))
    })
}

/// The pooling of the checkpoint's sentence-transformers `Pooling` module (`modules.json`
/// names its folder, usually `1_Pooling`); CLS without one.
fn read_pooling(dir: &Path) -> Result<Pooling, EngineError> {
    let modules: Option<Value> =
        std::fs::read_to_string(dir.join("modules.json")).ok().and_then(|s| serde_json::from_str(&s).ok());
    let folder = modules
        .as_ref()
        .and_then(Value::as_array)
        .and_then(|ms| {
            ms.iter().find(|m| m.get("type").and_then(Value::as_str).is_some_and(|t| t.ends_with("models.Pooling")))
        })
        .and_then(|m| m.get("path").and_then(Value::as_str))
        .unwrap_or("1_Pooling");
    let path = dir.join(folder).join("config.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(Pooling::Cls) };
    let v: Value = serde_json::from_str(&text).map_err(|e| EngineError::model(format!("{}: {e}", path.display())))?;
    let on = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    let modes: Vec<(&str, Option<Pooling>)> = vec![
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_lasttoken", Some(Pooling::Last)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let set: Vec<&(&str, Option<Pooling>)> = modes.iter().filter(|(k, _)| on(k)).collect();
    match set.as_slice() {
        [(_, Some(p))] => Ok(*p),
        [(k, None)] => {
            Err(EngineError::model(format!("{}: {k} is not implemented (mean, cls, lasttoken are)", path.display())))
        }
        [] => Ok(Pooling::Cls),
        _ => Err(EngineError::model(format!("{}: several pooling modes at once are not implemented", path.display()))),
    }
}

/// The `[SEP]` id of the checkpoint's `tokenizer.json` (its post-processor's, else the vocab's).
fn sep_id(dir: &Path) -> Option<u32> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).ok()?).ok()?;
    let from_pp = v.pointer("/post_processor/special_tokens/[SEP]/ids/0").and_then(Value::as_u64);
    let from_vocab = || v.pointer("/model/vocab/[SEP]").and_then(Value::as_u64);
    from_pp.or_else(from_vocab).map(|x| x as u32)
}

/// A GGUF file's BERT tensors under HF names (llama.cpp's `tensor_mapping.py` for
/// `MODEL_ARCH.BERT`).
struct BertGguf<'a, 'b> {
    ld: &'b crate::checkpoint::gguf::Gguf<'a>,
    threads: usize,
}

/// llama.cpp's name of the BERT tensor or module `hf` (`.weight` / `.bias` kept).
fn bert_gguf_name(hf: &str) -> Option<String> {
    super::vb::map_module(hf, |stem| match stem {
        "embeddings.word_embeddings" => Some("token_embd".to_owned()),
        "embeddings.position_embeddings" => Some("position_embd".to_owned()),
        "embeddings.token_type_embeddings" => Some("token_types".to_owned()),
        "embeddings.LayerNorm" => Some("token_embd_norm".to_owned()),
        _ => {
            let (bid, module) = stem.strip_prefix("encoder.layer.")?.split_once('.')?;
            let bid: usize = bid.parse().ok()?;
            let file = match module {
                "attention.self.query" => "attn_q",
                "attention.self.key" => "attn_k",
                "attention.self.value" => "attn_v",
                "attention.output.dense" => "attn_output",
                "attention.output.LayerNorm" => "attn_output_norm",
                "intermediate.dense" => "ffn_up",
                "output.dense" => "ffn_down",
                "output.LayerNorm" => "layer_output_norm",
                _ => return None,
            };
            Some(format!("blk.{bid}.{file}"))
        }
    })
}

impl BertGguf<'_, '_> {
    fn named(&self, hf: &str) -> Result<String, EngineError> {
        bert_gguf_name(hf).ok_or_else(|| EngineError::model(format!("no GGUF tensor name for BERT tensor {hf}")))
    }
}

impl Tensors for BertGguf<'_, '_> {
    fn has(&self, name: &str) -> bool {
        bert_gguf_name(name).is_some_and(|n| self.ld.has_tensor(&n))
    }
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        self.ld.vector(&self.named(name)?, len)
    }
    fn matrix(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.ld.matrix_threads(&self.named(&format!("{module}.weight"))?, rows, cols, self.threads)
    }
}

struct Layer {
    /// Query, key and value stacked (`attention.self.{query,key,value}`).
    qkv: Linear,
    /// `attention.output.dense`.
    out: Linear,
    /// `attention.output.LayerNorm` (weight, bias).
    ln_attn: (Vec<f32>, Vec<f32>),
    /// `intermediate.dense`.
    up: Linear,
    /// `output.dense`.
    down: Linear,
    /// `output.LayerNorm`.
    ln_out: (Vec<f32>, Vec<f32>),
}

/// The classification head of a cross-encoder: `pooler.dense` (tanh) then `classifier`.
struct Classifier {
    pooler: Linear,
    classifier: Linear,
}

/// A BERT encoder (see the module docs).
pub struct BertModel {
    cfg: BertConfig,
    info: ModelInfo,
    pool: ThreadPool,
    isa: Isa,
    /// `embeddings.word_embeddings`, `[vocab × hidden]` (rows read with `row_f32`: a GGUF file
    /// may store it quantized).
    word: Weight,
    /// `embeddings.position_embeddings`, `[max_positions × hidden]`.
    position: Weight,
    /// `embeddings.token_type_embeddings`, `[type_vocab × hidden]`.
    token_type: Weight,
    /// `embeddings.LayerNorm`.
    ln_embed: (Vec<f32>, Vec<f32>),
    layers: Vec<Layer>,
    head: Option<Classifier>,
    inst: Instruments,
    xq: sparrow_cpu::format::ggml::QActs,
}

impl BertModel {
    /// Loads an HF BERT checkpoint directory (`BertModel` as sentence-transformers ships it, or
    /// `BertForSequenceClassification` under `bert.`), weights in F32/F16/BF16.
    ///
    /// # Errors
    /// As [`BertConfig::read`]; missing tensors or shapes other than the config's, named.
    pub fn load_hf(dir: &Path, threads: usize) -> Result<BertModel, EngineError> {
        let cfg = BertConfig::read(dir)?;
        let ck = Checkpoint::open(dir)?;
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Self::assemble(cfg, &ck, name, threads)
    }

    /// Loads a GGUF file of llama.cpp's `bert` architecture (`convert_hf_to_gguf.py`'s
    /// `BertModel`: `bert.*` keys, `token_embd` / `position_embd` / `token_types`, `blk.N.attn_q`
    /// …, `bert.pooling_type` 1 mean, 2 CLS, 3 last); weights of any type the matmuls read.
    ///
    /// # Errors
    /// A missing key or tensor, named; a pooling type other than mean, CLS or last (a GGUF
    /// reranker's `rank` pooling is not implemented); a causal `bert.attention.causal`.
    pub fn load_gguf(path: &Path, threads: usize) -> Result<BertModel, EngineError> {
        use ggus::GGufMetaMapExt;
        let file = crate::checkpoint::gguf::GgufFile::open(path)?;
        let ld = file.view()?;
        let keys = ld.arch_keys("bert");
        let err = |m: String| EngineError::model(format!("{}: {m}", path.display()));
        let num = |k: &str| positive(&keys, k, "bert.", path);
        if keys.get("attention.causal").and_then(Value::as_bool) == Some(true) {
            return Err(err("bert.attention.causal is true: a causal BERT is not implemented".into()));
        }
        let pooling = match keys.get("pooling_type").and_then(Value::as_u64) {
            None | Some(1) => Pooling::Mean,
            Some(2) => Pooling::Cls,
            Some(3) => Pooling::Last,
            Some(p) => {
                return Err(err(format!("bert.pooling_type {p}: only 1 (mean), 2 (cls) and 3 (last) are implemented")))
            }
        };
        let (hidden, heads) = (num("embedding_length")?, num("attention.head_count")?);
        if hidden % heads != 0 {
            return Err(err(format!("embedding_length {hidden} is not a multiple of head_count {heads}")));
        }
        let rows = |name: &str| -> Result<usize, EngineError> {
            let (_, shape, _) = ld.tensor(name)?;
            shape.last().copied().ok_or_else(|| err(format!("tensor {name} has no shape")))
        };
        let max_positions = num("context_length")?;
        let cfg = BertConfig {
            vocab: rows("token_embd.weight")?,
            hidden,
            layers: num("block_count")?,
            heads,
            intermediate: num("feed_forward_length")?,
            max_positions,
            max_len: max_positions,
            type_vocab: if ld.has_tensor("token_types.weight") { rows("token_types.weight")? } else { 1 },
            eps: keys.get("attention.layer_norm_epsilon").and_then(Value::as_f64).unwrap_or(1e-12) as f32,
            pooling,
            num_labels: None,
            sep_id: ld.meta().get_usize("tokenizer.ggml.seperator_token_id").ok().map(|v| v as u32),
        };
        let name = ld.meta().general_name().map(str::to_owned).unwrap_or_default();
        let src = BertGguf { ld: &ld, threads };
        let mut m = Self::assemble(cfg, &src, name, threads)?;
        m.info.file_weight_bytes = Some(ld.read_bytes());
        Ok(m)
    }

    /// The model from its tensors under HF names (`src`: a checkpoint, or a GGUF file through
    /// [`BertGguf`]).
    fn assemble(cfg: BertConfig, src: &dyn Tensors, name: String, threads: usize) -> Result<BertModel, EngineError> {
        // A classification checkpoint keeps the encoder under `bert.`.
        let root = Vb::new(src);
        let vb = match src.has("bert.embeddings.word_embeddings.weight") {
            true => root.pp("bert"),
            false => root.clone(),
        };
        let (h, f) = (cfg.hidden, cfg.intermediate);
        let ln = |vb: &Vb<'_>, name: &str| -> Result<(Vec<f32>, Vec<f32>), EngineError> {
            Ok((vb.vector(&format!("{name}.weight"), h)?, vb.vector(&format!("{name}.bias"), h)?))
        };
        // Every BERT projection has a bias: a file without one is not this model.
        let need_bias = |x: Linear| -> Result<Linear, EngineError> {
            match x.bias {
                Some(_) => Ok(x),
                None => Err(EngineError::model(format!("{}: bias missing", x.modules.join(", ")))),
            }
        };
        let emb = vb.pp("embeddings");
        let word = emb.matrix("word_embeddings", cfg.vocab, h)?;
        let position = emb.matrix("position_embeddings", cfg.max_positions, h)?;
        let token_type = emb.matrix("token_type_embeddings", cfg.type_vocab, h)?;
        let ln_embed = ln(&emb, "LayerNorm")?;
        // Grown as layers load: the count is the file's word until the tensors are found.
        let mut layers = Vec::new();
        for l in 0..cfg.layers {
            let lb = vb.pp("encoder.layer").pp(l);
            let att = lb.pp("attention");
            let q = need_bias(att.linear("self.query", h, h)?)?;
            let k = need_bias(att.linear("self.key", h, h)?)?;
            let v = need_bias(att.linear("self.value", h, h)?)?;
            layers.push(Layer {
                qkv: Linear::stack(vec![q, k, v]),
                out: need_bias(att.linear("output.dense", h, h)?)?,
                ln_attn: ln(&att, "output.LayerNorm")?,
                up: need_bias(lb.linear("intermediate.dense", f, h)?)?,
                down: need_bias(lb.linear("output.dense", h, f)?)?,
                ln_out: ln(&lb, "output.LayerNorm")?,
            });
        }
        let head = match cfg.num_labels {
            Some(n) => Some(Classifier {
                pooler: vb.linear("pooler.dense", h, h)?,
                classifier: root.linear("classifier", n, h)?,
            }),
            None => None,
        };
        let pool = ThreadPool::new(threads.max(1)).map_err(|e| EngineError::model(format!("thread pool: {e}")))?;
        let weight_bytes = root.held_bytes();
        let info = ModelInfo {
            architecture: "bert".into(),
            name,
            vocab_size: cfg.vocab,
            context_length: cfg.max_len,
            num_layers: cfg.layers,
            hidden_size: h,
            weight_bytes,
            file_weight_bytes: None,
            active_weight_bytes: None,
        };
        Ok(BertModel {
            cfg,
            info,
            pool,
            isa: Isa::detect(),
            word,
            position,
            token_type,
            ln_embed,
            layers,
            head,
            inst: Instruments::default(),
            xq: Default::default(),
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }
}

/// LayerNorm of every `h`-wide row of `x` in place: `(x − mean) / √(var + ε) · w + b`, mean
/// and (biased) variance accumulated in f64 so a row's result does not depend on its length
/// of rounding steps.
fn layer_norm(pool: &ThreadPool, x: &mut [f32], (w, b): &(Vec<f32>, Vec<f32>), eps: f32) {
    let h = w.len();
    pool.par_rows(x, h, |_, row| {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / h as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / h as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for ((v, g), c) in row.iter_mut().zip(w).zip(b) {
            *v = ((*v as f64 - mean) * inv) as f32 * g + c;
        }
    });
}

/// The exact GELU (HF `"gelu"`, `torch.nn.functional.gelu`) on the pool by rows.
fn gelu(pool: &ThreadPool, x: &mut [f32], w: usize) {
    pool.par_row_chunks(x, w, |_, rows| sparrow_cpu::kernels::gelu_erf(rows));
}

impl Model for BertModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn attention_needs(&self) -> AttentionNeeds {
        AttentionNeeds {
            kind: "bidirectional",
            kv_layout: KvLayout::gqa(self.cfg.layers, self.cfg.heads, self.cfg.head_dim()).with_dtype(KvDtype::F32),
            sliding_window: false,
        }
    }

    fn instruments(&self) -> Option<&Instruments> {
        Some(&self.inst)
    }

    fn instruments_mut(&mut self) -> Option<&mut Instruments> {
        Some(&mut self.inst)
    }

    fn embedding_only(&self) -> bool {
        true
    }

    fn set_embedding(&mut self) -> Result<EmbeddingSpec, EngineError> {
        Ok(match self.cfg.num_labels {
            Some(n) => EmbeddingSpec { dim: n, pooling: Pooling::Cls, labels: true },
            None => EmbeddingSpec { dim: self.cfg.hidden, pooling: self.cfg.pooling, labels: false },
        })
    }

    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        let c = &self.cfg;
        let (h, f, nh, hd) = (c.hidden, c.intermediate, c.heads, c.head_dim());
        let n = batch.num_tokens();
        if let Some(s) = batch.seqs.iter().find(|s| s.prefix_len != 0) {
            return Err(EngineError::Internal(format!(
                "an encoder needs whole sequences, but sequence {} starts at position {}",
                s.req_pool_idx, s.prefix_len
            )));
        }
        if let Some(&p) = batch.positions.iter().find(|&&p| p as usize >= c.max_positions) {
            return Err(EngineError::model(format!("position {p} beyond the {} position embeddings", c.max_positions)));
        }
        if let Some(&id) = batch.input_ids.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(EngineError::model(format!("token id {id} outside the vocabulary ({})", c.vocab)));
        }
        if kv.layout().dtype != KvDtype::F32 {
            return Err(EngineError::model("the encoder keeps its keys and values in f32"));
        }
        let clock = self.inst.clock();
        let mut pt = PartTimes::default();
        let mut cx = Fwd {
            pool: &self.pool,
            isa: self.isa,
            xq: std::mem::take(&mut self.xq),
            observer: &mut self.inst.observer,
            parts: clock.is_some().then_some(&mut pt),
        };
        // Segment ids: 0 through the first [SEP] of each sequence, 1 after it.
        let mut types = vec![0usize; n];
        if let (Some(sep), true) = (c.sep_id, c.type_vocab > 1) {
            for s in &batch.seqs {
                let r = s.token_start as usize..(s.token_start + s.extend_len) as usize;
                if let Some(k) = batch.input_ids[r.clone()].iter().position(|&t| t == sep) {
                    types[r.start + k + 1..r.end].iter_mut().for_each(|t| *t = 1);
                }
            }
        }
        let mut x = vec![0f32; n * h];
        let (mut pe, mut te) = (vec![0f32; h], vec![0f32; h]);
        for (t, row) in x.chunks_mut(h).enumerate() {
            let (id, p, ty) = (batch.input_ids[t] as usize, batch.positions[t] as usize, types[t]);
            self.word.row_f32(id, row);
            self.position.row_f32(p, &mut pe);
            self.token_type.row_f32(ty, &mut te);
            // HF's order: (word + token type) + position.
            for ((v, t), p) in row.iter_mut().zip(&te).zip(&pe) {
                *v = *v + t + p;
            }
        }
        layer_norm(&self.pool, &mut x, &self.ln_embed, c.eps);
        // The sequence of every token, for attention.
        let mut seq_of = vec![0usize; n];
        for (i, s) in batch.seqs.iter().enumerate() {
            seq_of[s.token_start as usize..(s.token_start + s.extend_len) as usize].iter_mut().for_each(|v| *v = i);
        }
        let (mut qkv, mut attn, mut proj, mut up) =
            (vec![0f32; n * 3 * h], vec![0f32; n * h], vec![0f32; n * h], vec![0f32; n * f]);
        let scale = 1.0 / (hd as f32).sqrt();
        for (l, layer) in self.layers.iter().enumerate() {
            layer.qkv.forward(&mut cx, &x, n, &mut qkv);
            for (t, &slot) in batch.out_cache_loc.iter().enumerate() {
                let s = slot as usize * h;
                kv.component_mut(l, 0)[s..s + h].copy_from_slice(&qkv[t * 3 * h + h..t * 3 * h + 2 * h]);
                kv.component_mut(l, 1)[s..s + h].copy_from_slice(&qkv[t * 3 * h + 2 * h..t * 3 * h + 3 * h]);
            }
            let (keys, values) = (kv.component(l, 0), kv.component(l, 1));
            let isa = self.isa;
            cx.timed(
                |p| &mut p.attention,
                || {
                    self.pool.par_rows(&mut attn, h, |t, out| {
                        let s = seq_of[t];
                        let slots = &batch.kv_indices[batch.kv_indptr[s] as usize..batch.kv_indptr[s + 1] as usize];
                        let mut scores = vec![0f32; slots.len()];
                        out.fill(0.0);
                        for head in 0..nh {
                            let q = &qkv[t * 3 * h + head * hd..][..hd];
                            for (sc, &slot) in scores.iter_mut().zip(slots) {
                                *sc = sparrow_cpu::kernels::dot(isa, q, &keys[slot as usize * h + head * hd..][..hd])
                                    * scale;
                            }
                            sparrow_cpu::kernels::softmax_in_place(&mut scores);
                            let o = &mut out[head * hd..(head + 1) * hd];
                            for (&p, &slot) in scores.iter().zip(slots) {
                                sparrow_cpu::kernels::axpy(isa, p, &values[slot as usize * h + head * hd..][..hd], o);
                            }
                        }
                    });
                },
            );
            layer.out.forward(&mut cx, &attn, n, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
            layer_norm(&self.pool, &mut x, &layer.ln_attn, c.eps);
            layer.up.forward(&mut cx, &x, n, &mut up);
            gelu(&self.pool, &mut up, f);
            layer.down.forward(&mut cx, &up, n, &mut proj);
            x.iter_mut().zip(&proj).for_each(|(a, b)| *a += b);
            layer_norm(&self.pool, &mut x, &layer.ln_out, c.eps);
        }
        // One pooled row per sequence that asked for output.
        let wanted: Vec<&crate::batch::SeqMeta> = batch.seqs.iter().filter(|s| s.num_logits > 0).collect();
        let mut pooled = vec![0f32; wanted.len() * h];
        // A classification head reads the CLS token.
        let pooling = if self.head.is_some() { Pooling::Cls } else { c.pooling };
        for (row, s) in pooled.chunks_mut(h).zip(&wanted) {
            let (a, len) = (s.token_start as usize, s.extend_len as usize);
            match pooling {
                Pooling::Cls => row.copy_from_slice(&x[a * h..(a + 1) * h]),
                Pooling::Last => row.copy_from_slice(&x[(a + len - 1) * h..(a + len) * h]),
                Pooling::Mean => {
                    // f64 sums: the mean of a long sequence loses nothing to accumulation order.
                    for (j, v) in row.iter_mut().enumerate() {
                        let sum: f64 = (a..a + len).map(|t| x[t * h + j] as f64).sum();
                        *v = (sum / len as f64) as f32;
                    }
                }
            }
        }
        let out = match &self.head {
            None => pooled,
            Some(head) => {
                let m = wanted.len();
                let mut p = vec![0f32; m * h];
                head.pooler.forward(&mut cx, &pooled, m, &mut p);
                p.iter_mut().for_each(|v| *v = v.tanh());
                let mut logits = vec![0f32; m * head.classifier.out_features()];
                head.classifier.forward(&mut cx, &p, m, &mut logits);
                logits
            }
        };
        self.xq = cx.xq;
        self.inst.record(clock, pt);
        Ok(out)
    }
}
