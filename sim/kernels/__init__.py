"""The simulator's inner loops, compiled with numba, one module per topic they serve.

At every weight push the fleet stops, reloads and replans every engine together: passes over all
samples in flight (tens of thousands at 1024 GPUs). As numpy expressions each such pass costs one
trip over memory per operation; here each is one loop. Floating-point arithmetic keeps the order
of the formulas it replaced and numba's default strict IEEE mode (no fastmath: no reassociation,
no fused multiply-adds), so results are the same bits (bench/sim_compare.py checks a change
against an older tree). Kernels compile on first use and are cached beside their module (about
ten seconds once per install).
"""
