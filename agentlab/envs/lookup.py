"""``lookup``: the smallest real agent task — find a fictional person in a directory and answer a question.

It is the workbench's fixture and its fastest learner: two tools, two turns, a seeded directory of 600 people
with five attributes each, and deliberate distractors (people who share a first or a last name), so a policy
that answers without searching, or trusts the first hit, fails. Used by the quickstart, by the fast tests and
as the pattern the larger environments follow.

    >>> from agentlab.envs import load
    >>> spec = load("lookup")
    >>> env = spec.make_env(); task = spec.make_tasks("test", 1, seed=0)[0]
    >>> env.reset(task=task.to_json()) is None
    True
"""

from __future__ import annotations

import re
from functools import lru_cache

from agentlab.rewards import Reward
from agentlab.types import Budget, EnvSpec, Outcome, Task, ToolCall, ToolEnv, seeded_rng, tool

FIRST = ["Ada", "Bram", "Cora", "Dag", "Edda", "Finn", "Greta", "Hugo", "Ines", "Jon", "Kaia", "Lars", "Mira", "Nils", "Olga", "Per", "Rana", "Sven", "Tove", "Ulf"]
LAST = ["Vell", "Morn", "Strand", "Ekholm", "Dahl", "Brekke", "Lunde", "Falk", "Hovd", "Aas", "Rud", "Sand", "Berg", "Lien", "Moe", "Haug", "Vik", "Nes", "Bakke", "Holm", "Lie", "Tveit", "Fossum", "Eide", "Myhre", "Solberg", "Kvam", "Ness", "Grov", "Ruud"]
ATTRIBUTES = {
    "city": ["Oslo", "Bergen", "Tromso", "Lisbon", "Porto", "Lyon", "Nantes", "Graz", "Ghent", "Turku", "Tartu", "Cork", "Bilbao", "Split", "Krakow"],
    "job": ["baker", "nurse", "pilot", "welder", "teacher", "farmer", "chemist", "tailor", "plumber", "librarian", "surveyor", "potter"],
    "pet": ["cat", "dog", "parrot", "rabbit", "tortoise", "hamster", "goldfish", "ferret", "canary", "lizard"],
    "sport": ["chess", "rowing", "tennis", "climbing", "judo", "cycling", "fencing", "curling", "archery", "skiing"],
    "colour": ["red", "blue", "green", "amber", "violet", "teal", "ochre", "crimson", "indigo", "silver"],
}
QUESTIONS = {
    "city": "In which city does {name} live?",
    "job": "What does {name} do for a living?",
    "pet": "What kind of pet does {name} keep?",
    "sport": "Which sport does {name} practise?",
    "colour": "What is the favourite colour of {name}?",
}
N_PEOPLE = 600
# People are split by index so no person appears in two splits (the audit checks it too).
SPLITS = {"train": range(360), "validation": range(360, 420), "test": range(420, 600)}
SYSTEM_PROMPT = (
    "You are a careful assistant with access to a people directory. Search the directory for the person "
    "named in the question, read their record, then call `answer` with the exact value from the record."
)


@lru_cache(maxsize=1)
def directory() -> tuple[dict, ...]:
    """The seeded directory: 600 people, unique full names, attributes drawn independently."""
    rng = seeded_rng("lookup-directory", 1)
    names = [f"{f} {l}" for f in FIRST for l in LAST]
    rng.shuffle(names)
    return tuple(
        {"id": f"P{i:03d}", "name": names[i], **{a: rng.choice(v) for a, v in ATTRIBUTES.items()}}
        for i in range(N_PEOPLE)
    )


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


class LookupEnv(ToolEnv):
    name = "lookup"
    final_tool = "answer"
    system_prompt = SYSTEM_PROMPT

    @tool
    def search_people(self, query: str) -> str:
        """Search the people directory by name.

        Args:
            query: Words of the person's name, for example "Ada Vell".

        Returns:
            Up to three matching records, one per line: id, name and all attributes.
        """
        if not isinstance(query, str) or not query.strip():
            return self._error("query must be a non-empty string, e.g. search_people(query='Ada Vell').")
        terms = _words(query[:500])
        scored = []
        for person in directory():
            first, last = person["name"].lower().split()
            # Last names weigh more than first names: it makes same-first-name people weaker distractors.
            score = 1.0 * (first in terms) + 1.5 * (last in terms)
            if score:
                scored.append((-score, person["id"], person))
        hits = [p for _, _, p in sorted(scored)[:3]]
        if not hits:
            return "No person matches that query."
        self._record([p["id"] for p in hits])
        return "\n".join(
            f"{p['id']} | {p['name']} | " + " | ".join(f"{a}: {p[a]}" for a in ATTRIBUTES) for p in hits
        )

    @tool
    def answer(self, value: str) -> str:
        """Give the final answer and end the episode.

        Args:
            value: The attribute value copied from the person's record, for example "Oslo".

        Returns:
            A confirmation; no further tool calls are possible.
        """
        if not isinstance(value, str):
            return self._error("value must be a string, e.g. answer(value='Oslo').")
        self._outcome.final = [value.strip()[:200]]
        self._outcome.finished = True
        return "Answer recorded."


def make_tasks(split: str, n: int, seed: int = 0, attributes: tuple[str, ...] = tuple(ATTRIBUTES)) -> list[Task]:
    """``n`` questions about people of ``split``; the same (split, n, seed) always gives the same tasks."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    unknown = set(attributes) - set(ATTRIBUTES)
    if unknown:
        raise ValueError(f"unknown attributes {sorted(unknown)}; expected a subset of {sorted(ATTRIBUTES)}")
    people = [directory()[i] for i in SPLITS[split]]
    pairs = [(p, a) for p in people for a in attributes]
    if n > len(pairs):
        raise ValueError(f"split {split!r} has only {len(pairs)} distinct questions; asked for {n}")
    rng = seeded_rng("lookup-tasks", split, seed)
    chosen = rng.sample(pairs, n)
    return [
        Task(
            id=f"lookup-{split}-{p['id']}-{a}",
            env="lookup",
            question=QUESTIONS[a].format(name=p["name"]),
            answer={"person": p["id"], "attribute": a, "value": p[a]},
            meta={"attribute": a},
        )
        for p, a in chosen
    ]


def evaluate(task: Task, outcome: Outcome) -> dict:
    """Success: the answer equals the person's attribute (case-insensitive)."""
    given = outcome.final[0].lower() if outcome.final else ""
    success = float(given == task.answer["value"].lower())
    return {"success": success, "exact": success, "answered": float(bool(outcome.final)),
            "found_person": float(task.answer["person"] in outcome.seen)}


def expert(task: Task):
    person = next(p for p in directory() if p["id"] == task.answer["person"])
    result = yield ToolCall("search_people", {"query": person["name"]})
    line = next((ln for ln in result.splitlines() if ln.startswith(person["id"])), "")
    value = re.search(rf"{task.answer['attribute']}: ([^|]+)", line)
    yield ToolCall("answer", {"value": value.group(1).strip() if value else ""})


def last_name_only(task: Task):
    """The cheap strategy: search the person's last name alone and answer from the first record, unchecked.

    Each last name is shared by 20 people and the search lists the lowest ids first, so this succeeds when the
    person asked about happens to come first, or shares the attribute with whoever does (measured on every
    question of each split: train 0.17, validation 0.05, test 0.09; train people have the lowest ids).
    """
    last = re.findall(r"\b(" + "|".join(LAST) + r")\b", task.question)
    result = yield ToolCall("search_people", {"query": last[-1] if last else task.question})
    first = result.splitlines()[0] if result else ""
    value = re.search(rf"{task.answer['attribute']}: ([^|]+)", first)
    yield ToolCall("answer", {"value": value.group(1).strip() if value else ""})


def random_policy(task: Task):
    rng = seeded_rng("lookup-random", task.id)
    yield ToolCall("search_people", {"query": rng.choice(FIRST)})
    attr = rng.choice(list(ATTRIBUTES))
    yield ToolCall("answer", {"value": rng.choice(ATTRIBUTES[attr])})


def audit_keys(task: Task) -> dict[str, list[str]]:
    return {"line": [task.question + " => " + task.answer["value"]], "answer": [task.answer["person"]], "query": [task.question]}


def _lookup_name(task: Task, result: str) -> list[str]:
    """Records in a search result whose full name appears in the question."""
    rows = [line.split(" | ") for line in result.splitlines() if line.count(" | ") >= 2]
    return [row[0] for row in rows if row[1] in task.question]


def hint(kind: str, task: Task, call: ToolCall, result: str) -> str:
    """Training-time feedback (``agentlab.hints``): procedural ``guidance``, or an enriched ``state`` observation."""
    if call.name != "search_people":
        return ""
    attribute = task.meta.get("attribute", "the attribute asked for")
    if kind == "guidance":
        return ("Hint: use only the record whose name matches the question exactly, then call "
                f"answer(value=...) with that record's {attribute}, copied exactly.")
    exact = _lookup_name(task, result)
    return (f"[state: {len(result.splitlines())} record(s) returned; exact name match: "
            f"{', '.join(exact) or 'none - search again with the full name'}; the question asks for: {attribute}]")


# What GRPO trains on unless a config says otherwise. No format bonus: GRPO normalises rewards within each group, so
# in a group where nothing succeeds a 0.1 bonus for "answered" becomes a full-size advantage (measured after a 4-step
# SFT, in an early run of this project: success fell 0.31 -> 0.00 in 6 steps as the policy learned to answer without
# searching; notebook 05 counts, on doc_search's rollouts, the groups where such a bonus would bite).
DEFAULT_REWARD = Reward({"success": 1.0})


SPEC = EnvSpec(
    name="lookup", env_class=LookupEnv, make_tasks=make_tasks, evaluate=evaluate,
    default_reward=DEFAULT_REWARD, hint=hint,
    budget=Budget(max_turns=3, max_new_tokens=48, max_context=1024),  # search, answer, one spare; calls ~30 tokens
    expert=expert, random_policy=random_policy, audit_keys=audit_keys, cheap_policy=last_name_only,
    description="Fictional people directory: search by name, answer one attribute (fixture and quickstart).",
)
