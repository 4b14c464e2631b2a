"""smolagents in its default configuration, as the compatibility suite runs it (tests/harness_cli.py):
a ToolCallingAgent or a CodeAgent on an OpenAI-compatible model (`OpenAIServerModel`, whose OpenAI
client takes OPENAI_BASE_URL and OPENAI_API_KEY from the environment) with one tool, `bash`.
Prints the agent's final answer.

    python smolagents_agent.py tool|code TASK
"""

import subprocess
import sys

from smolagents import CodeAgent, OpenAIServerModel, ToolCallingAgent, tool


@tool
def bash(command: str) -> str:
    """Runs a shell command line and returns what it printed.

    Args:
        command: the shell command line to run
    """
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def main(kind: str, task: str) -> None:
    model = OpenAIServerModel(model_id="hrl-scripted")
    agent = {"tool": ToolCallingAgent, "code": CodeAgent}[kind](tools=[bash], model=model, max_steps=8)
    print(agent.run(task))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
