"""Which features and which cosine threshold flag the near-duplicates of a query round?

``store.near_duplicate_threshold`` flags two samples of one round whose features have a cosine
similarity at or above it (``eada.store.rounds.near_duplicates``). This measures, on real
data, how the cosine of near-duplicate pairs compares with the cosine of every other pair:

* Office-31 webcam (all 795 images), frozen EfficientNet-Lite0 features (the 1,280-d pooled
  features a frozen-backbone project holds): the webcam domain holds genuine near-duplicates,
  consecutive frames of one object.
* The digits project (preset ``digits/mnist-usps``, target USPS train, 7,291 images): its
  target rows as stored (decoded pixels normalised to [-1, 1], what a from-scratch image
  project flagged on before) and the model's embeddings (LeNet's penultimate layer) after
  1 and 5 epochs of the preset's training (seed 0; the preset queries after epochs 1-5).

Office-31 ground truth (pixel-level near-identity): two images of ONE class whose RGB
thumbnails at 32x32, scaled to [0, 1], differ by a mean absolute difference below 0.05 AND whose
16x16 thumbnails have a normalised cross-correlation (cosine of the mean-centred pixels) of at
least 0.93. The mean absolute difference alone also pairs different small objects on one desk
(two pens); the correlation alone pairs different objects in one layout (two bags in one
corner); both together held up on visual checks (BENCHMARKS.md). Every other pair (same class or
not) is a negative. Per threshold: true and false positives over ALL pairs of the domain,
precision, recall, F1, and the best-F1 threshold.

Digits: USPS holds no two pixel-identical samples (counted by the same rule at a mean absolute
difference below 0.005 and a correlation of 0.99), so every flag among its own samples is a
false one, and the pixel rule above would call two similar "1"s of two writers duplicates. The
positives are rescans instead: 500 random samples copied with a one-pixel shift, a contrast
change of +-10 % and noise (std 0.03); per threshold, the recall on (sample, rescan) pairs and
the false flags over all pairs of distinct samples (per 10,000 pairs and per round of 30,
435 pairs, at that rate).

Usage (repository root, ../shared/data beside it; one thread):

    python benchmarks/investigations/near_duplicates.py [--data ../shared/data] [--epochs 1,5]
                                         [--out benchmarks/results/near_duplicates.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from eada.config import ImageListData, ModelConfig
from eada.data.base import TensorDomain
from eada.data.image_tasks import image_domains
from eada.data.images import load_image_list
from eada.data.tasks import load_task
from eada.hparams import preset_config
from eada.runs import environment_info, write_json
from eada.threads import set_threads
from eada.train import ActiveDATrainer
from eada.train.evaluate import embed_samples

MAD_BELOW = 0.05  # ground truth: mean absolute difference of 32x32 thumbnails in [0, 1]
NCC_AT_LEAST = 0.93  # ground truth: correlation of 16x16 thumbnails
THRESHOLDS = [round(float(t), 3) for t in np.arange(0.80, 0.995, 0.01)] + [0.995, 0.998, 0.999]


def thumbnails(images: torch.Tensor, size: int) -> torch.Tensor:
    """``(N, C, H, W)`` images in [0, 1] -> ``(N, C*size*size)`` (bilinear, antialiased)."""
    t = F.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
    return t.reshape(len(images), -1)


def ground_truth(
    images: torch.Tensor,
    labels: np.ndarray,
    mad_below: float = MAD_BELOW,
    ncc_at_least: float = NCC_AT_LEAST,
) -> np.ndarray:
    """The near-identical pairs ``(i, j)``, ``i < j``, of one class (the module's rule)."""
    small = thumbnails(images, 32)
    tiny = thumbnails(images, 16)
    tiny = F.normalize(tiny - tiny.mean(dim=1, keepdim=True), dim=1)
    pairs = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        mad = torch.cdist(small[idx], small[idx], p=1) / small.shape[1]
        ncc = tiny[idx] @ tiny[idx].T
        hit = (mad < mad_below) & (ncc >= ncc_at_least)
        i, j = torch.nonzero(torch.triu(hit, diagonal=1), as_tuple=True)
        pairs.append(np.stack([idx[i.numpy()], idx[j.numpy()]], axis=1))
    return np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=int)


def _upper_blocks(x: torch.Tensor, block: int = 1024) -> Iterator[tuple[int, torch.Tensor]]:
    """Row blocks of the cosine matrix of ``x``, upper triangle only (others set to -2)."""
    n = len(x)
    for a in range(0, n, block):
        sim = x[a : a + block] @ x.T
        rows = torch.arange(a, min(a + block, n)).unsqueeze(1)
        sim[torch.arange(n).unsqueeze(0) <= rows] = -2.0
        yield a, sim


def _flag_counts(x: torch.Tensor) -> tuple[torch.Tensor, dict[str, float], int]:
    """Over every pair of the rows of ``x`` (unit vectors): how many have a cosine >= each
    threshold of :data:`THRESHOLDS`, quantiles of the cosines, the number of pairs."""
    ts = torch.tensor(THRESHOLDS)
    flagged = torch.zeros(len(ts), dtype=torch.long)
    hist = torch.zeros(4000, dtype=torch.long)
    for _, sim in _upper_blocks(x):
        v = sim[sim > -1.5]
        flagged += (v.unsqueeze(0) >= ts.unsqueeze(1)).sum(dim=1)
        hist += torch.histc(v, bins=4000, min=-1, max=1).long()
    edges = torch.linspace(-1, 1, 4001)
    cdf = torch.cumsum(hist, 0).double() / hist.sum()
    quant = {
        str(q): float(edges[1 + int(torch.searchsorted(cdf, q))])
        for q in (0.5, 0.99, 0.999, 0.9999)
    }
    return flagged, quant, len(x) * (len(x) - 1) // 2


def sweep(features: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """Precision/recall of ``cosine >= t`` against the ground-truth pairs, for each t of
    :data:`THRESHOLDS`, over every pair of the domain; the cosine distribution of the
    near-duplicate pairs and of the other same-domain pairs."""
    x = F.normalize(torch.as_tensor(features, dtype=torch.float32).reshape(len(features), -1))
    flagged, quant, n_pairs = _flag_counts(x)
    pos = (x[truth[:, 0]] * x[truth[:, 1]]).sum(dim=1) if len(truth) else torch.empty(0)
    rows = []
    for k, t in enumerate(THRESHOLDS):
        tp = int((pos >= t).sum())
        fl = int(flagged[k])
        prec = tp / fl if fl else float("nan")
        rec = tp / len(truth) if len(truth) else float("nan")
        f1 = 2 * prec * rec / (prec + rec) if fl and tp else 0.0
        rows.append(
            {
                "threshold": t,
                "flagged": fl,
                "tp": tp,
                "fp": fl - tp,
                "fn": len(truth) - tp,
                "precision": prec,
                "recall": rec,
                "f1": f1,
                "flagged_per_1000_pairs": 1000 * fl / n_pairs,
            }
        )
    best = max(rows, key=lambda r: (r["f1"], r["threshold"]))
    return {
        "pairs": n_pairs,
        "near_duplicate_pairs": len(truth),
        "near_duplicate_cosine": {
            k: float(np.quantile(pos.numpy(), q)) if len(pos) else None
            for k, q in (("min", 0.0), ("p10", 0.1), ("median", 0.5), ("max", 1.0))
        },
        "all_pairs_cosine_quantiles": quant,
        "sweep": rows,
        "best_f1": best,
    }


def office31_webcam(data: Path) -> dict[str, Any]:
    """Frozen EfficientNet-Lite0 features of all webcam images (cached under .cache)."""
    web = data / "office31" / "webcam"
    il = load_image_list(web)
    cfg = ImageListData(source=web, target=web, workers=0)
    model = ModelConfig(
        name="backbone", backbone="efficientnet_lite0", weights="pretrained", freeze_backbone=True
    )
    t0 = time.perf_counter()
    domains, _ = image_domains(
        cfg, model, {"target": il}, progress=lambda s: print(s, file=sys.stderr)
    )
    feats = domains["target"].x.numpy()  # read from the cache after the first run
    imgs = torch.stack(
        [
            torch.from_numpy(
                np.array(Image.open(p).convert("RGB").resize((64, 64), Image.BILINEAR))
            )
            for p in il.paths
        ]
    )
    imgs = imgs.permute(0, 3, 1, 2).float() / 255
    labels = np.asarray(il.labels)
    truth = ground_truth(imgs, labels)
    out = {
        "domain": "office31/webcam (all 795 images)",
        "truth_pairs": [
            f"{il.classes[labels[i]]}/{il.paths[i].name}~{il.paths[j].name}" for i, j in truth
        ],
        "features": {"efficientnet_lite0 (frozen)": sweep(feats, truth)},
        "seconds": time.perf_counter() - t0,
    }
    return out


def rescans(x: torch.Tensor, n: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """``n`` random samples of ``x`` (``(N, C, H, W)`` in [0, 1]) scanned again: shifted by
    one pixel in a random direction (zero fill), contrast times U(0.9, 1.1), Gaussian noise
    of std 0.03, clipped to [0, 1]. Returns their positions and the copies."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(x), generator=g)[:n]
    moves = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]
    out = torch.zeros_like(x[idx])
    h, w = x.shape[-2:]
    for k, i in enumerate(idx.tolist()):
        dy, dx = moves[int(torch.randint(len(moves), (1,), generator=g))]
        src = x[i][:, max(0, -dy) : h - max(0, dy), max(0, -dx) : w - max(0, dx)]
        out[k][:, max(0, dy) : h - max(0, -dy), max(0, dx) : w - max(0, -dx)] = src
    gain = 0.9 + 0.2 * torch.rand(n, 1, 1, 1, generator=g)
    noise = 0.03 * torch.randn(out.shape, generator=g)
    return idx.numpy(), (out * gain + noise).clamp(0, 1)


def false_flags(features: np.ndarray, copies: np.ndarray, idx: np.ndarray) -> dict[str, Any]:
    """Recall of ``cosine >= t`` on the (sample, its rescan) pairs and its false flags over
    every pair of distinct real samples (the domain holds no duplicates: no two of its
    samples are pixel-identical), per threshold of :data:`THRESHOLDS`; the expected false
    flags of a 30-sample round (435 pairs at the rate over all pairs) and the lowest
    threshold that flags at most 1 pair in 10,000."""
    x = F.normalize(torch.as_tensor(features, dtype=torch.float32).reshape(len(features), -1))
    c = F.normalize(torch.as_tensor(copies, dtype=torch.float32).reshape(len(copies), -1))
    pos = (x[torch.as_tensor(idx)] * c).sum(dim=1)
    flagged, quant, n_pairs = _flag_counts(x)
    rows = []
    for k, t in enumerate(THRESHOLDS):
        rate = int(flagged[k]) / n_pairs
        rows.append(
            {
                "threshold": t,
                "recall": float((pos >= t).float().mean()),
                "false_flags": int(flagged[k]),
                "false_flags_per_10000_pairs": 1e4 * rate,
                "false_flags_per_round_of_30": 435 * rate,
            }
        )
    ok = [r for r in rows if r["false_flags_per_10000_pairs"] <= 1.0]
    return {
        "pairs": n_pairs,
        "rescans": len(idx),
        "rescan_cosine": {
            k: float(np.quantile(pos.numpy(), q))
            for k, q in (("min", 0.0), ("p10", 0.1), ("median", 0.5), ("max", 1.0))
        },
        "all_pairs_cosine_quantiles": quant,
        "sweep": rows,
        "at_most_1_in_10000": ok[0] if ok else None,
    }


def digits_usps(data: Path, epochs: list[int], seed: int = 0, n: int = 500) -> dict[str, Any]:
    """USPS (train) as the target of the digits/mnist-usps preset: its stored pixel rows and
    the model's embeddings, against ``n`` rescans of its own samples."""
    t0 = time.perf_counter()
    cfg = preset_config("digits/mnist-usps", "eada", seed, [f"data.root={data / 'digits'}"])
    task = load_task(cfg.data, seed, cfg.model)
    target = task.target
    x = target.x  # normalised to [-1, 1]
    unit = x * 0.5 + 0.5
    exact = ground_truth(unit, target.y.numpy(), mad_below=0.005, ncc_at_least=0.99)
    idx, copies01 = rescans(unit, n, seed)
    copies = copies01 * 2 - 1  # the stored normalisation
    feats: dict[str, Any] = {
        "pixels (stored rows, [-1, 1])": false_flags(x.numpy(), copies.numpy(), idx),
        "pixels (rescaled to [0, 1])": false_flags(unit.numpy(), copies01.numpy(), idx),
    }
    mu = x.mean(dim=0, keepdim=True)
    feats["pixels centred on the pool mean"] = false_flags(
        (x - mu).numpy(), (copies - mu).numpy(), idx
    )
    print("digits: pixels done", file=sys.stderr)
    trainer = ActiveDATrainer(cfg, task)
    both = TensorDomain("rescans", copies, target.y[torch.as_tensor(idx)], target.classes)
    done = 0
    for e in sorted(epochs):
        while done < e:
            for _ in range(trainer.steps_per_epoch()):
                trainer.train_step()
            done += 1
        bs = cfg.train.eval_batch_size
        emb = embed_samples(trainer.model, target, torch.arange(len(target)), bs, "cpu")
        emb_c = embed_samples(trainer.model, both, torch.arange(n), bs, "cpu")
        feats[f"lenet embedding after epoch {e}"] = false_flags(emb, emb_c, idx)
        m = emb.mean(axis=0, keepdims=True)
        feats[f"lenet embedding after epoch {e}, centred on the pool mean"] = false_flags(
            emb - m, emb_c - m, idx
        )
        print(f"digits: embedding after epoch {e} done", file=sys.stderr)
    return {
        "domain": "digits/usps train (7,291 images) as the target of digits/mnist-usps",
        "seed": seed,
        "pixel_identical_pairs": len(exact),
        "features": feats,
        "seconds": time.perf_counter() - t0,
    }


def markdown(result: dict[str, Any]) -> str:
    """Two tables: Office-31 webcam against its pixel ground truth (precision/recall), digits
    against rescans (recall, false flags)."""
    res = result["office31"]
    lines = [
        f"**{res['domain']}**: {len(res['truth_pairs'])} pixel-near-identical pairs among "
        f"{next(iter(res['features'].values()))['pairs']} pairs\n",
        "| features | their cosine min / p10 / median | all pairs p99.9 | best F1 (t) "
        "| P / R there | P / R at 0.95 |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in res["features"].items():
        c, b = s["near_duplicate_cosine"], s["best_f1"]
        at = next(r for r in s["sweep"] if r["threshold"] == 0.95)
        lines.append(
            f"| {name} | {c['min']:.3f} / {c['p10']:.3f} / {c['median']:.3f} | "
            f"{s['all_pairs_cosine_quantiles']['0.999']:.3f} | {b['f1']:.2f} ({b['threshold']}) "
            f"| {b['precision']:.2f} / {b['recall']:.2f} ({b['tp']} of {b['flagged']}) | "
            f"{at['precision']:.2f} / {at['recall']:.2f} ({at['tp']} of {at['flagged']}) |"
        )
    res = result["digits"]
    first = next(iter(res["features"].values()))
    lines += [
        f"\n**{res['domain']}**: {first['rescans']} rescans against {first['pairs']} pairs of "
        f"distinct samples ({res['pixel_identical_pairs']} pixel-identical)\n",
        "| features | rescan cosine min / p10 / median | all pairs p99.9 | at 0.95: recall, "
        "false flags per round of 30 | lowest t with <= 1 false flag in 10,000 pairs: recall |",
        "|---|---|---|---|---|",
    ]
    for name, s in res["features"].items():
        c = s["rescan_cosine"]
        at = next(r for r in s["sweep"] if r["threshold"] == 0.95)
        ok = s["at_most_1_in_10000"]
        lines.append(
            f"| {name} | {c['min']:.3f} / {c['p10']:.3f} / {c['median']:.3f} | "
            f"{s['all_pairs_cosine_quantiles']['0.999']:.3f} | {at['recall']:.2f}, "
            f"{at['false_flags_per_round_of_30']:.2f} | "
            + ("none" if ok is None else f"t = {ok['threshold']}: {ok['recall']:.2f}")
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--epochs", default="1,5", help="embeddings after these epochs (digits)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/near_duplicates.json"))
    args = ap.parse_args()
    set_threads(1)
    torch.manual_seed(args.seed)
    result: dict[str, Any] = {
        "ground_truth": {"mad_below": MAD_BELOW, "ncc_at_least": NCC_AT_LEAST},
        "office31": office31_webcam(args.data),
        "digits": digits_usps(args.data, [int(e) for e in args.epochs.split(",")], args.seed),
        "environment": environment_info(),
    }
    write_json(args.out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
