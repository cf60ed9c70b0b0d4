"""Synthetic dialogue-summarisation data in the DialogSum schema, for offline runs and tests.

Each record has `id`, `dialogue`, `summary` and `topic`, like `knkarthick/dialogsum` on the Hugging
Face hub, so the same loader reads both. The summary is a deterministic function of facts stated in
the dialogue (who, what, where, when), which gives a model real structure to learn: copying names and
places from the prompt into the answer. Torch-free, so the launcher can call it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from training.common.files import publish_text

NAMES = [
    "Alice",
    "Bruno",
    "Chen",
    "Dara",
    "Emeka",
    "Fatima",
    "Goran",
    "Hana",
    "Ivan",
    "Jonas",
    "Kemal",
    "Lena",
    "Mateo",
    "Nadia",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tariq",
]
ACTIVITIES = [
    ("play tennis", "sports"),
    ("study for the exam", "school"),
    ("see a film", "leisure"),
    ("review the budget", "work"),
    ("go hiking", "sports"),
    ("fix the bike", "chores"),
    ("cook dinner", "leisure"),
    ("plan the trip", "travel"),
    ("visit the museum", "leisure"),
    ("prepare the slides", "work"),
]
PLACES = ["the library", "the station", "the park", "the office", "the cafe", "the gym", "the market"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TIMES = ["8 am", "9 am", "10 am", "noon", "2 pm", "4 pm", "6 pm", "7 pm"]
AGREEMENTS = ["Sounds good.", "Perfect, see you then.", "Great, it's a plan.", "OK, I'll be there."]


def make_record(rng: random.Random, index: int) -> dict[str, str]:
    first, second = rng.sample(NAMES, 2)
    activity, topic = rng.choice(ACTIVITIES)
    place, day, time = rng.choice(PLACES), rng.choice(DAYS), rng.choice(TIMES)
    lines = [
        f"#Person1#: Hi {second}, it's {first}. Do you want to {activity} on {day}?",
        f"#Person2#: Sure, {first}. Where should we meet?",
        f"#Person1#: How about {place} at {time}?",
        f"#Person2#: {rng.choice(AGREEMENTS)}",
    ]
    summary = f"{first} and {second} will {activity} at {place} at {time} on {day}."
    return {"id": f"synthetic_{index}", "dialogue": "\n".join(lines), "summary": summary, "topic": topic}


def write_dialogues(path: Path, count: int = 2000, seed: int = 0) -> Path:
    """Write `count` records as JSONL (atomically); the same seed always gives the same file."""
    rng = random.Random(seed)
    lines = (json.dumps(make_record(rng, index)) + "\n" for index in range(count))
    return publish_text(path, "".join(lines))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="JSONL file to write")
    parser.add_argument("--count", type=int, default=2000, help="number of dialogues")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args()
    print(write_dialogues(args.output, args.count, args.seed))
