"""Running `turnplug` as a new user would: the console script, real files, stdin closed."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# The console script installed next to this interpreter.
TURNPLUG = str(Path(sys.executable).with_name("turnplug"))

# The functions the command-line tests' configs refer to, written next to each config as a
# user would write them.
SHOP_HOOKS = textwrap.dedent(
    """
    import sys

    import trio

    from pipeline import block, cont, halt, regenerate
    from turns import Text

    NOT_CALLABLE = 3


    def faq(turn):
        return [Text("[faq] Refunds take 14 days.")]


    def gate(turn):
        if "secret" in turn.user_message.text:
            return halt("asked for a secret", reply="I cannot share that.")
        return cont(turn)


    def never_happy(turn):
        return regenerate("Say it differently.")


    def database(turn):
        raise RuntimeError("the database is down")


    def two_arguments(turn, extra):
        return cont(turn)


    def history(turn):
        print(f"history={len(turn.context.messages)}", file=sys.stderr, flush=True)
        return cont(turn)


    def order_status(order: str, verbose: bool = False) -> str:
        '''An order's status.'''
        return f"order {order}: shipped"


    def today() -> str:
        '''Today's date.'''
        return "2025-01-31"


    def no_refunds(call, turn):
        return block("refunds need a person")


    def trim(call, result, turn):
        return cont(result.with_content(result.content[:200]))


    def polite(text):
        return "please" in text.lower() or "Say please."


    def search(query, k):
        return [f"about {query}"][:k]


    async def maybe_slow(turn):
        if "slow" in turn.user_message.text:
            print("slow hook started", flush=True)
            await trio.sleep_forever()
        return cont(turn)
    """
)


def write_config(directory: Path, text: str, name: str = "shop.toml") -> Path:
    """A config file `name` in `directory`, with shop_hooks.py beside it."""
    (directory / "shop_hooks.py").write_text(SHOP_HOOKS)
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def environment(**extra: str) -> dict[str, str]:
    """This environment without provider keys, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    return env | extra


def turnplug(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``turnplug ARGS`` to the end, standard input closed."""
    return subprocess.run(
        [TURNPLUG, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
        cwd=cwd,
        env=environment() if env is None else env,
    )
