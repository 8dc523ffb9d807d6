"""Cost evaluations per second: vectorised (one numpy call) vs one query at a time, same run.

    python bench/costmodel_speed.py [--n 20000]

Both paths price the same decode and train queries; the ratio is what the planner gains by
pricing thousands of candidates in one call. Machines here are shared: compare the ratio.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from traces import get_gpu, get_model
from traces.costmodel import CostModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="queries per path")
    args = parser.parse_args()
    cm = CostModel()
    gpu, model = get_gpu("H20"), get_model("qwen2.5-7b")
    rng = np.random.default_rng(0)
    tp = rng.choice([1, 2, 4, 8], size=args.n)
    batch = rng.integers(1, 512, size=args.n)
    ctx = rng.integers(128, 16384, size=args.n)
    dp = rng.choice([1, 2, 4, 8, 16], size=args.n)
    tokens = rng.integers(10_000, 1_000_000, size=args.n).astype(float)

    t0 = time.perf_counter()
    vec_decode = cm.decode(gpu, model, tp, batch, ctx).seconds
    vec_train = cm.train(gpu, model, dp, 1, 1, tokens).seconds
    vec_s = time.perf_counter() - t0

    k = min(args.n, 2000)  # the scalar path is slow; time a slice and scale per query
    t0 = time.perf_counter()
    one_decode = [float(cm.decode(gpu, model, int(tp[i]), int(batch[i]), int(ctx[i])).seconds) for i in range(k)]
    one_train = [float(cm.train(gpu, model, int(dp[i]), 1, 1, float(tokens[i])).seconds) for i in range(k)]
    one_s = time.perf_counter() - t0

    np.testing.assert_allclose(vec_decode[:k], one_decode, rtol=1e-12)
    np.testing.assert_allclose(vec_train[:k], one_train, rtol=1e-12)
    vec_rate = 2 * args.n / vec_s
    one_rate = 2 * k / one_s
    print(f"vectorised:       {vec_rate:>14,.0f} evaluations/s  ({2 * args.n} in {vec_s * 1e3:.1f} ms)")
    print(f"one at a time:    {one_rate:>14,.0f} evaluations/s  ({2 * k} in {one_s * 1e3:.1f} ms)")
    print(f"speed-up (ratio): {vec_rate / one_rate:>14,.0f}x   (identical results checked)")


if __name__ == "__main__":
    main()
