"""Generate the bundled demo model: a small Qwen2-shaped causal LM, trained briefly on CPU.

    python resources/make_demo_model.py [OUT_DIR]

3 decoder layers, hidden 256, 4 query heads / 2 KV heads of 64, MLP 512 (SwiGLU), vocab 512,
bfloat16, about 2 M parameters (4 MB). The starting weights imitate a trained LLM's statistics:
a normal bulk with per-row scale variation, a few outlier input features (large columns, as in
LLM.int8()) in the projections that read the residual stream, a few hot output rows,
heavy-tailed embeddings, norms around 1 and small q/k/v biases. From there the model is trained
for TRAIN_STEPS steps of next-token prediction on resources/calibration.txt (tokenized with the
demo tokenizer, one sample per line, as `check` reads it), so that its next-token distributions
are peaked like a real LM's instead of the near-flat ones of a random network; training moves
the weights but keeps the outlier columns (see `weight_report`). About a minute or two on one
CPU core. Deterministic: seeded, one thread, float32 (the same torch build on the same kind of
CPU writes the same bytes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.core.floatbits import f32_to_bf16  # noqa: E402
from workbench.export.st_writer import StreamingSafetensorsWriter  # noqa: E402

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 256, 3, 4, 2, 64, 512, 512
OUTLIER_FEATURES = [17, 93, 211]  # residual-stream dimensions with large activations


def linear(rng, out_f, in_f, std, outlier_cols=(), col_gain=6.0, hot_rows=0):
    w = rng.standard_normal((out_f, in_f)).astype(np.float32) * std
    w *= rng.lognormal(0.0, 0.25, size=(out_f, 1)).astype(np.float32)  # per-row scale spread
    for c in outlier_cols:
        w[:, c] *= col_gain * rng.uniform(0.7, 1.3)
    if hot_rows:
        rows = rng.choice(out_f, hot_rows, replace=False)
        w[rows] *= rng.uniform(3.0, 6.0, size=(hot_rows, 1)).astype(np.float32)
    return w


def build(seed: int = 20261122) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    t: dict[str, np.ndarray] = {}
    emb = rng.standard_t(df=4, size=(VOCAB, HIDDEN)).astype(np.float32) * 0.02
    emb[:, OUTLIER_FEATURES] *= 4.0
    t["model.embed_tokens.weight"] = emb
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        q = HEADS * HEAD_DIM
        kv = KV_HEADS * HEAD_DIM
        t[p + "self_attn.q_proj.weight"] = linear(rng, q, HIDDEN, 0.035, OUTLIER_FEATURES, hot_rows=2)
        t[p + "self_attn.q_proj.bias"] = (0.05 * rng.standard_normal(q)).astype(np.float32)
        t[p + "self_attn.k_proj.weight"] = linear(rng, kv, HIDDEN, 0.035, OUTLIER_FEATURES, hot_rows=2)
        t[p + "self_attn.k_proj.bias"] = (0.3 * rng.standard_normal(kv)).astype(np.float32)
        t[p + "self_attn.v_proj.weight"] = linear(rng, kv, HIDDEN, 0.02, OUTLIER_FEATURES[:1])
        t[p + "self_attn.v_proj.bias"] = (0.01 * rng.standard_normal(kv)).astype(np.float32)
        t[p + "self_attn.o_proj.weight"] = linear(rng, HIDDEN, q, 0.02, hot_rows=1)
        t[p + "post_attention_layernorm.weight"] = (1.0 + 0.15 * rng.standard_normal(HIDDEN)).astype(np.float32)
        t[p + "mlp.gate_proj.weight"] = linear(rng, MLP, HIDDEN, 0.03, OUTLIER_FEATURES)
        t[p + "mlp.up_proj.weight"] = linear(rng, MLP, HIDDEN, 0.03, OUTLIER_FEATURES)
        down = linear(rng, HIDDEN, MLP, 0.02, hot_rows=0)
        down[OUTLIER_FEATURES] *= 6.0  # writes the outlier features back
        t[p + "mlp.down_proj.weight"] = down
    t["model.norm.weight"] = (1.0 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)
    t["lm_head.weight"] = linear(rng, VOCAB, HIDDEN, 0.03, OUTLIER_FEATURES, col_gain=3.0)
    return t


CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": HIDDEN,
    "intermediate_size": MLP, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 512,
    "rope_theta": 10000.0, "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 0,
    "_comment": "demo model generated and trained by resources/make_demo_model.py",
}


EOS = "<|endoftext|>"

TRAIN_STEPS, TRAIN_LR, TRAIN_BATCH, TRAIN_WARMUP, TRAIN_SEED = 300, 3e-3, 32, 20, 20261126
MAX_LEN = 128  # tokens per sample, as `check` reads the calibration file


def calibration_ids(out: Path) -> list[np.ndarray]:
    """The token ids of every non-empty line of resources/calibration.txt, as the workbench's
    calibration reads them (the demo tokenizer, no special tokens, at most MAX_LEN tokens)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = (Path(__file__).resolve().parent / "calibration.txt").read_text(encoding="utf-8")
    return [np.asarray(tok.encode(line).ids[:MAX_LEN], dtype=np.int64)
            for line in text.splitlines() if line.strip()]


def _hf_model(t: dict[str, np.ndarray]):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**{k: v for k, v in CONFIG.items() if not k.startswith("_")})
    cfg._attn_implementation = "eager"
    model = Qwen2ForCausalLM(cfg).float()
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in t.items()},
                          strict=True)
    return model


def _batch(ids: list[np.ndarray], idx):
    """Right-padded token ids and labels (-100 on the padding, which the causal mask keeps
    from influencing the real tokens)."""
    import torch
    n = max(len(ids[i]) for i in idx)
    x = torch.zeros((len(idx), n), dtype=torch.long)
    y = torch.full((len(idx), n), -100, dtype=torch.long)
    for r, i in enumerate(idx):
        a = torch.from_numpy(ids[i])
        x[r, :len(a)] = a
        y[r, :len(a)] = a
    return x, y


def perplexity(t: dict[str, np.ndarray], ids: list[np.ndarray]) -> float:
    """Next-token perplexity of the weights `t` (float32, transformers' Qwen2) over `ids`."""
    import torch
    model = _hf_model(t).eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), TRAIN_BATCH):
            x, y = _batch(ids, range(s, min(s + TRAIN_BATCH, len(ids))))
            lg, yy = model(x).logits[:, :-1], y[:, 1:]
            nll += float(torch.nn.functional.cross_entropy(
                lg.reshape(-1, lg.shape[-1]), yy.reshape(-1), ignore_index=-100, reduction="sum"))
            n += int((yy != -100).sum())
    return float(np.exp(nll / n))


def train(t: dict[str, np.ndarray], ids: list[np.ndarray], steps: int = TRAIN_STEPS,
          log=None) -> dict[str, np.ndarray]:
    """Train the weights `t` (from `build`) on the samples `ids`: next-token cross-entropy,
    AdamW (lr TRAIN_LR, betas 0.9/0.95, no weight decay, gradients clipped at norm 1),
    linear warm-up then cosine decay, TRAIN_BATCH samples a step in a seeded order (each epoch
    a fresh permutation). float32 on one CPU thread. Returns the trained float32 arrays."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = _hf_model(t).train()
        opt = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, betas=(0.9, 0.95),
                                weight_decay=0.0)
        rng = np.random.default_rng(TRAIN_SEED)
        order: list[int] = []
        for step in range(steps):
            while len(order) < TRAIN_BATCH:
                order += [int(i) for i in rng.permutation(len(ids))]
            idx, order = order[:TRAIN_BATCH], order[TRAIN_BATCH:]
            x, y = _batch(ids, idx)
            lr = TRAIN_LR * min(1.0, (step + 1) / TRAIN_WARMUP) * 0.5 * (1 + np.cos(np.pi * step / steps))
            for g in opt.param_groups:
                g["lr"] = lr
            loss = model(input_ids=x, labels=y).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if log is not None and (step % 50 == 0 or step == steps - 1):
                log(f"step {step + 1}/{steps}: loss {loss.item():.3f}")
        sd = model.state_dict()
        return {k: sd[k].detach().numpy().astype(np.float32).copy() for k in t}
    finally:
        torch.set_num_threads(threads)


def weight_report(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> list[str]:
    """One line per projection that reads the residual stream: the outlier columns' mean norm
    over the median column norm, before and after training."""
    lines = []
    for name, w0 in before.items():
        if w0.ndim != 2 or w0.shape[1] != HIDDEN or any(s in name for s in ("embed", "o_proj")):
            continue
        r = [float(np.linalg.norm(w, axis=0)[OUTLIER_FEATURES].mean()
                   / np.median(np.linalg.norm(w, axis=0))) for w in (w0, after[name])]
        lines.append(f"{name}: outlier columns {r[0]:.2f}x -> {r[1]:.2f}x the median column")
    return lines


def build_tokenizer(out: Path) -> None:
    """A byte-level BPE of exactly VOCAB tokens trained on resources/calibration.txt
    (deterministic), saved as tokenizer.json + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = (Path(__file__).resolve().parent / "calibration.txt").read_text(encoding="utf-8")
    tok.train_from_iterator(text.splitlines(), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": EOS,
        "pad_token": EOS, "unk_token": None, "model_max_length": 512,
        "add_bos_token": False, "add_eos_token": False}, indent=2) + "\n")


def main(out_dir: str | None = None, log=print) -> Path:
    out = Path(out_dir) if out_dir else Path(__file__).resolve().parent / "demo_model"
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    ids = calibration_ids(out)
    start = build()
    log(f"training on {len(ids)} samples, {sum(len(a) for a in ids)} tokens; "
        f"perplexity {perplexity(start, ids):.1f}")
    trained = train(start, ids, log=log)
    log(f"trained: perplexity {perplexity(trained, ids):.3f} (float32)")
    for line in weight_report(start, trained):
        log(line)
    return write_model(out, trained)


def write_model(out: Path, tensors: dict[str, np.ndarray]) -> Path:
    """model.safetensors (bfloat16) and config.json of `tensors` in the folder `out`."""
    w = StreamingSafetensorsWriter(out / "model.safetensors",
                                   {"format": "pt", "generator": "quant-workbench demo"})
    for name, arr in tensors.items():
        w.add(name, f32_to_bf16(arr).reshape(arr.shape), dtype="BF16")
    w.finish()
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    return out / "model.safetensors"


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else None))
