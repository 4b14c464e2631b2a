"""A harness written with the OpenAI Agents SDK in its default configuration (Responses API,
default model, base URL from OPENAI_BASE_URL): a triage agent that hands off to a shell agent,
whose function tool runs a command. Prints the final output.

    python agents_triage.py TASK
"""

import subprocess
import sys

from agents import Agent, Runner, function_tool


@function_tool
def bash(command: str) -> str:
    """Run a shell command and return what it printed."""
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30).stdout


shell_agent = Agent(name="Shell agent", handoff_description="Runs shell commands.",
                    instructions="Run the command the user asks for and report its output.", tools=[bash])
triage = Agent(name="Triage agent", instructions="Hand the request to the agent that can handle it.",
               handoffs=[shell_agent])

if __name__ == "__main__":
    print(Runner.run_sync(triage, sys.argv[1]).final_output)
