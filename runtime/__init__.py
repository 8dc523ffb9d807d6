"""The runtime: execute a plan for real (torch or vLLM engines; in one process or on Ray).

The pieces of a run:
- `model`: tiny Llama (or Qwen3-MoE) from a config + character tokenizer, saved as a Hugging Face folder;
  `tiny_moe`: the tiny mixture-of-experts configs (transformers' Qwen3-MoE and Mixtral).
- `task`: digit addition with an exact-match reward and a stated chance level.
- `contracts`: what a run needs from a task and a tokenizer (the toy's and a real model's fit).
- `hf_model`: any local Hugging Face causal LM and its tokenizer (chat template), checked before loading.
- `dataset`: a prompt/answer data set from JSONL or parquet; `data_task`: it as a task.
- `rewards`: the built-in `math` and `addition` rewards, and `module:function` for one's own.
- `task_factory`: what a run trains (`TaskSource`: the toy, or `--model` on `--dataset`) and its `RunSetup`.
- `tiny_hf`: the CPU test model, a tiny Qwen2 with a BPE tokenizer trained on the shipped corpus;
  `arith_data`: the shipped arithmetic/word-problem set and that corpus (runtime/data/);
  `calc_data`: the calculator task's set (runtime/data/calc.jsonl) and the tool corpus.
- `calculator`: integer + - * / arithmetic parsed by hand; `calculator_tool`: the `<calc>EXPR</calc>` tool;
  `episodes`: multi-turn episodes (agentic workloads): tool calls off the loop, real seeded latency.
- `engine`: the rollout-engine interface and a continuous-batching torch engine with a KV cache.
- `vllm_engine`, `vllm_worker`: the same interface on vLLM, and its worker's in-place weight loading.
- `engine_spec`: which engine a run uses (vLLM where it can run here, else torch) and how each is built.
- `trainer`: GRPO advantages, AReaL's decoupled PPO loss, Adam, atomic checkpoints.
- `parallel`: data-parallel trainer ranks (DDP or FSDP2), the same step as one trainer.
- `controller`: the async loop's controller (traces.staleness's capacity rule, group routing,
  staleness-safe batch selection, records), shared by both loops.
- `sync`: weight sync over a gloo group of its own (trainer rank 0 broadcasts, engines receive).
- `records`: `metrics.jsonl`, the timeline CSV in the simulator's format, checkpoint commits.
- `evaluation`: a policy's expected reward on the task. `profile`: this machine's stage costs.

Running one:
- `run_setup`: what a run starts from; `run_result`: how its loop ended and the run's summary.
- `loop`: the asynchronous loop in one process (round-robin), `run_in_process`.
- `ray_run`: a run on Ray from start-up to tear-down, `run_on_ray`; `ray_start`: Ray's start-up.
- `ray_loop`: the driver on Ray (`RayLoop`, `TrainerLost`); `ray_futures`: results of calls to dying actors.
- `engine_worker`, `trainer_worker`: the engine (vLLM or torch) and trainer-rank actors;
  `engine_spec`: which engine a run uses and how each is built.
- `fleet`: the engine actors' handles, spawning, sync-group joins and replacements;
  `engine_factory`: how engine actors are spawned and what of a plan group an engine kind refuses.
- `run_plan`: what of a plan and workload a run executes (`RunShape`) and what it refuses.
- `placement`: one Ray placement group per plan group, pinned to its GPU type and plan nodes;
  `placement_record`: who ran where (`placement.json`, `phases.json`).
- `local_cluster`: `rlfleet run --local`'s Ray cluster of fake nodes mirroring a cluster file.
- `settings`: sync limits and the `Faults` to inject; `fault_injection` fires them; `committer`: the
  checkpoint commit thread.
- `toy`: the entry points, `run_toy` (one process) and `run_toy_ray`, on the toy task or a `TaskSource`.

Imports point only to `traces` (never `sim` or `planner`), so the runtime ships without them
(tests/test_layering.py checks it).
"""
