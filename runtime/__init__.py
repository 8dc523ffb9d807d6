"""The runtime: execute a plan for real (first slice: in-process, torch only).

- `model`: tiny Llama from a config + character tokenizer, saved as a Hugging Face folder.
- `task`: digit addition with an exact-match reward and a stated chance level.
- `engine`: the rollout-engine interface and a continuous-batching torch engine with a KV cache.
- `trainer`: GRPO advantages, AReaL's decoupled PPO loss, Adam, atomic checkpoints.
- `staleness`: AReaL's capacity rule and the staleness-safe batch selection.
- `loop`: the asynchronous loop (round-robin in one process), `run_toy`.
- `records`: `metrics.jsonl` and the timeline CSV in the simulator's format.

Imports point only to `traces` (never `sim` or `planner`), so the runtime ships without them.
"""
