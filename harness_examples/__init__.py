"""Example harnesses that use the proxy the way any user's harness would (an OpenAI `base_url`
per agent, rewards through `harnessrl.client`). Each runs on its own:

    python -m harnessrl.harness_examples.planner_worker --proxy URL   # planner + search workers (MATPO setting)
    python -m harnessrl.harness_examples.bfcl_multiturn --proxy URL   # BFCL multi-turn, state-check outcome
    python -m harnessrl.harness_examples.react --proxy URL            # single-agent ReAct (GRPO baseline)
    python -m harnessrl.harness_examples.langgraph_search --proxy URL # LangGraph + langchain-openai
    python -m harnessrl.harness_examples.lookup --proxy URL           # key lookup (the learning benchmark's task)

and each exposes `run_rollout(proxy_url_or_client, ..., task, cfg, group_id=, run=)` returning a
`RolloutResult` for the training loop. `--export-tasks FILE` writes the tasks as the JSONL of
`harnessrl tasks import`.
"""
