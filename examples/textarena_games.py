"""A third-party game package as your own task: textarena's Guess-the-Number as a TRL-style environment class.

    make setup-examples                   # this example's own requirement: textarena (not the library's)
    python examples/textarena_games.py --n 1500 --out data/guess/rows.jsonl      # task rows, each with two scripts
    agentlab replay --env examples/textarena_games.py:GuessTheNumber --tasks data/guess/rows.jsonl \
        --column cheap_calls --out data/guess/cheap_demos.jsonl                    # demonstrations from a script
    agentlab compare --env examples/textarena_games.py:GuessTheNumber --tasks data/guess/rows.jsonl \
        --demos data/guess/cheap_demos.jsonl --arms sft_best,grpo,expert_iteration

textarena (the game engine behind TRL's Wordle notebook) runs its logic games offline. The class is written the way
TRL's documentation writes one — ``reset(**row)``, one docstringed tool, a reward method — and knows nothing of
agentlab. A row names the game and its seed (``{"prompt", "game", "seed"}``); ``reset`` starts that game and
returns its rules, which the loop appends to the prompt as TRL does; ``guess`` makes a move and returns only what
the game added (textarena's observation repeats the whole history); ``reward`` is 1 for a win, 0 otherwise
(textarena pays a lost game by its closeness; a win is what we count).

Two scripted strategies give every row ground-truth calls, played here against the real game:
``calls`` (binary search: always wins, at most 6 guesses for 1-50) and ``cheap_calls`` (start in the middle and
hop 1 to 4 toward the hint, the hop drawn at random each guess: wins about 6 games in 10) — the traces one has
before an expert exists, a player who follows the hints but never tracks the range. SFT on the cheap traces
imitates the cheap strategy, its randomness included, so a group of sampled games mixes wins and losses; whether
GRPO turns that into better guesses is the question ``agentlab compare`` answers. (A cheap strategy without
randomness, "step by one", gives an SFT policy whose every group is all wins or all losses: GRPO learns nothing.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

GAME = "GuessTheNumber-v0-hardcore"  # 1 to 50 in 10 guesses
PROMPT = [{"role": "user", "content": "Win this game. Make each guess with the guess tool."}]


class GuessTheNumber:
    """textarena's Guess-the-Number, one game per row: ``reset(**row)``, the ``guess`` tool, ``reward``."""

    def reset(self, **row):
        import textarena as ta

        self.game = ta.make(row.get("game", GAME))
        self.game.reset(num_players=1, seed=int(row["seed"]))
        _, self.seen = self.game.get_observation()
        self.won, self.over, self.moves = False, False, 0
        return "\n\n" + self.seen.strip()

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: Your guess, a whole number within the game's range.

        Returns:
            Whether the secret number is higher or lower than the guess, or that the game is won or over.
        """
        if self.over:
            return "The game is over."
        self.moves += 1
        done, _ = self.game.step(f"[{int(number)}]")
        if done:
            _, info = self.game.close()
            self.over, self.won = True, info[0]["reason"].startswith("Congratulations")
            return "Correct: you won." if self.won else f"Game over: {info[0]['reason']}"
        _, observation = self.game.get_observation()
        new, self.seen = observation[len(self.seen):], observation
        return "\n".join(line.removeprefix("[GAME] ") for line in new.strip().splitlines()
                         if not line.startswith("[Player]"))  # the game echoes the move; the model made it

    def reward(self) -> float:
        return float(self.won)


def binary_search(seed: int):
    """The expert: halve the range each guess. A strategy is a generator: it yields a guess and is sent the reply;
    ``seed`` (the game's) seeds whatever it draws."""
    low, high = 1, 50
    while low <= high:
        g = (low + high) // 2
        reply = yield g
        if "higher" in reply:
            low = g + 1
        elif "lower" in reply:
            high = g - 1
        else:
            return


def cheap_hop(seed: int):
    """The cheap strategy: start at 25 and hop 1 to 4 toward the hint, the hop drawn each guess; the range already
    ruled out is not tracked, so a hop can overshoot and come back."""
    rng, g = random.Random(f"hop-{seed}"), 25
    while True:
        reply = yield g
        if "higher" not in reply and "lower" not in reply:
            return
        hop = rng.randint(1, 4)
        g = min(50, max(1, g + (hop if "higher" in reply else -hop)))


def play(row: dict, strategy) -> tuple[list[dict], bool]:
    """``strategy`` played against the row's game: its calls and whether it won."""
    env, calls = GuessTheNumber(), []
    env.reset(**row)
    gen = strategy(int(row["seed"]))
    reply, g = None, next(gen)
    while not env.over:
        calls.append({"name": "guess", "arguments": {"number": g}})
        reply = env.guess(g)
        try:
            g = gen.send(reply)
        except StopIteration:
            break
    return calls, env.won


def rows(n: int, game: str = GAME, first_seed: int = 0) -> list[dict]:
    """``n`` task rows (seeds ``first_seed`` ...), each with both strategies' calls."""
    out = []
    for seed in range(first_seed, first_seed + n):
        row = {"prompt": PROMPT, "game": game, "seed": seed}
        row["calls"], _ = play(row, binary_search)
        row["cheap_calls"], _ = play(row, cheap_hop)
        out.append(row)
    return out


def rows_needed(sizes: dict) -> int:
    """Rows to write so that the hash split (~80% train, ~10% validation, ~10% test) holds ``sizes``, with slack."""
    return int(1.25 * max(sizes["train"] / 0.8, sizes["validation"] / 0.1, sizes["test"] / 0.1))


def game_figures(rollouts: Path) -> dict:
    """Win rate and guesses per game of one arm's rollouts file, each a mean with its 95% CI."""
    from agentlab.evals import mean_ci, read_rollouts

    episodes = read_rollouts(rollouts)[0]
    return {"win": mean_ci([ep.success for ep in episodes]),
            "moves": mean_ci([sum(len(t.tool_calls) for t in ep.turns) for ep in episodes])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1500)
    p.add_argument("--game", default=GAME)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    made = rows(a.n, a.game)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("".join(json.dumps(r) + "\n" for r in made))
    wins = {k: sum(play(r, s)[1] for r in made) / len(made) for k, s in (("expert", binary_search),
                                                                         ("cheap", cheap_hop))}
    print(f"{len(made)} rows of {a.game} -> {a.out}; scripted win rates: expert {wins['expert']:.3f}, "
          f"cheap {wins['cheap']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
