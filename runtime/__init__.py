"""The runtime: execute a plan for real (torch engines; in one process or on Ray).

- `model`: tiny Llama from a config + character tokenizer, saved as a Hugging Face folder.
- `task`: digit addition with an exact-match reward and a stated chance level.
- `engine`: the rollout-engine interface and a continuous-batching torch engine with a KV cache.
- `trainer`: GRPO advantages, AReaL's decoupled PPO loss, Adam, atomic checkpoints.
- `staleness`: AReaL's capacity rule and the staleness-safe batch selection.
- `controller`: the async loop's controller (capacity rule, group routing, batch selection, records).
- `loop`: the asynchronous loop (round-robin in one process), `run_toy`.
- `sync`: weight sync over a gloo group of its own (trainer rank 0 broadcasts, engines receive).
- `ray_loop`: engines and trainer as Ray actors on the plan's placement groups, `run_toy_ray`.
- `placement`: one Ray placement group per plan group, pinned to its GPU type.
- `records`: `metrics.jsonl` and the timeline CSV in the simulator's format.

Imports point only to `traces` (never `sim` or `planner`), so the runtime ships without them.
"""
