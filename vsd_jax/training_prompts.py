"""Training prompts for drafter distillation, built offline and disjoint from the eval suites.

Four families, each generated from templates and a seeded RNG (no downloads, no eval data):
- instructions: explain / compare / list / summarise / story / email / ... over ~100 topics;
- code: tasks built from Python standard-library signatures and docstrings (`inspect`), plus a
  few procedural ones ("Write a function that returns the k largest ...");
- math: procedurally generated arithmetic, algebra, percentage and word problems;
- follow-ups: multi-turn style requests that quote an earlier question.

MT-Bench and HumanEval are never read here; tests/test_drafter_folder.py checks that no
training prompt equals or contains one of their prompts. The output is deterministic for a
given seed and Python version (the code family reads the installed stdlib's docstrings).

  python -m vsd_jax.training_prompts --num 1000 --seed 0 --out out/prompts.jsonl
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import re
import sys

TOPICS = (
    "photosynthesis", "black holes", "the French Revolution", "compound interest", "vaccines",
    "the water cycle", "machine learning", "climate change", "the Roman Empire", "volcanoes",
    "inflation", "the human heart", "plate tectonics", "renewable energy", "the printing press",
    "DNA replication", "supply and demand", "the Silk Road", "electric cars", "sleep",
    "the immune system", "quantum computing", "coral reefs", "the stock market", "honeybees",
    "the Industrial Revolution", "recycling", "the Moon landing", "solar panels", "meditation",
    "antibiotics", "the internet", "rainforests", "public libraries", "chess", "jazz music",
    "the Olympic Games", "earthquakes", "nutrition", "time zones", "the speed of light",
    "ancient Egypt", "cryptocurrency", "urban gardening", "the metric system", "glaciers",
    "remote work", "the printing of money", "bridges", "airplanes", "the periodic table",
    "migration of birds", "social media", "coffee", "tea ceremonies", "volunteering",
    "marathon training", "budgeting", "credit scores", "3D printing", "robots in factories",
    "the Great Wall of China", "the Renaissance", "composting", "ocean tides", "rainbows",
    "the theory of evolution", "gravity", "magnets", "batteries", "clouds", "deserts",
    "the Amazon river", "mountain climbing", "learning a new language", "public speaking",
    "time management", "first aid", "electric guitars", "photography", "bread baking",
    "fermentation", "board games", "video game design", "open source software", "password security",
    "encryption", "cloud computing", "databases", "the human brain", "dinosaurs", "penguins",
    "wolves", "mushrooms", "tornadoes", "satellites", "Mars exploration", "submarines",
    "trains", "city planning", "minimalism", "origami", "knitting", "recurring habits",
)

AUDIENCES = ("a ten-year-old", "a high-school student", "a busy manager", "a curious grandparent",
             "a university student", "someone who has never heard of it")
CHARACTERS = ("a lighthouse keeper", "a young inventor", "a lost robot", "a retired teacher",
              "a street musician", "a shy dragon", "a ship's cook", "a detective cat",
              "an astronaut", "a village baker", "a forgetful wizard", "a marathon runner")
SITUATIONS = ("finds a mysterious map", "loses their voice before a big day",
              "discovers a hidden garden", "has to fix a broken clock", "meets an old friend",
              "wins an unexpected prize", "gets stuck in an elevator", "learns to swim",
              "plants a tree that grows overnight", "receives a letter from the future")
RECIPIENTS = ("my landlord", "a colleague", "my manager", "a customer", "my neighbour",
              "the school principal", "a hotel", "a software vendor", "a local newspaper")
EMAIL_SUBJECTS = ("a late rent payment", "rescheduling a meeting", "a broken heater",
                  "a refund request", "a job application follow-up", "a noise complaint",
                  "a project deadline", "a thank-you for their help", "a booking change")
ACTIVITIES = ("studying for exams", "saving money", "cooking for one", "running a first 5k",
              "keeping houseplants alive", "writing a resume", "travelling on a budget",
              "learning to code", "staying focused at home", "making new friends in a new city")

INSTRUCTION_TEMPLATES = (
    "Explain {topic} to {audience}.",
    "Explain {topic} in simple terms.",
    "What is {topic} and why does it matter?",
    "Compare {topic} and {topic2}: how are they alike and how do they differ?",
    "List five interesting facts about {topic}.",
    "List the main advantages and disadvantages of {topic}.",
    "Summarise the key ideas of {topic} in three sentences.",
    "Give a short overview of the history of {topic}.",
    "Write a short story about {character} who {situation}.",
    "Write a short poem about {topic}.",
    "Write a haiku about {topic}.",
    "Write a polite email to {recipient} about {email_subject}.",
    "Give me practical tips for {activity}.",
    "What are common misconceptions about {topic}?",
    "Describe a typical day for {character}.",
    "Write a short blog post introduction about {topic}.",
    "Create a quiz with three questions about {topic}, with answers.",
    "How would you teach {topic} to {audience}?",
    "Write a product description for a board game about {topic}.",
    "Give a step-by-step plan for {activity}.",
)

FOLLOW_UP_TEMPLATES = (
    "Earlier I asked you: \"{previous}\" Now make your answer shorter and simpler.",
    "Earlier I asked you: \"{previous}\" Can you turn the answer into a bulleted list?",
    "Follow-up to my previous question (\"{previous}\"): give one concrete example.",
    "You answered \"{previous}\" before. Now rewrite the answer for {audience}.",
    "Thanks for answering \"{previous}\". What would be a good next topic to learn?",
    "Regarding \"{previous}\": what are the three most important points to remember?",
)

# Modules whose public functions have informative one-line docstrings.
CODE_MODULES = ("json", "math", "statistics", "itertools", "functools", "collections", "string",
                "textwrap", "os.path", "re", "random", "heapq", "bisect", "datetime", "shutil",
                "base64", "hashlib", "difflib", "fnmatch", "glob", "copy", "operator", "csv",
                "calendar", "colorsys", "zlib", "html", "urllib.parse", "uuid", "secrets")

CODE_TEMPLATES = (
    "Explain what `{qualname}` does and show an example.",
    "Write a Python function that does the same as `{qualname}` without using it. Its "
    "documentation says: \"{summary}\"",
    "How do I use `{qualname}` in Python? Give a short example.",
    "Write a unit test for `{qualname}` using pytest.",
    "What does this Python signature mean: `{qualname}{signature}`? Explain each parameter.",
)

PROCEDURAL_CODE = (
    "Write a Python function that returns the {k} largest numbers in a list.",
    "Write a Python function that counts how many times each word appears in a string and "
    "returns the {k} most common ones.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and "
    "punctuation, and test it on {k} examples.",
    "Write a Python class for a stack with push, pop and peek, and show {k} operations.",
    "Write a Python function that splits a list into chunks of size {k}.",
    "Write a Python function that returns the first {k} prime numbers.",
    "Write a Python function that reads a CSV file and returns the average of column {k}.",
    "Write a Python function that rotates a list to the right by {k} positions.",
    "Write a SQL query that returns the {k} customers with the highest total order value.",
    "Write a JavaScript function that removes duplicates from an array and keeps the first {k}.",
)

NAMES = ("Tom", "Aisha", "Lena", "Carlos", "Mei", "Omar", "Sofia", "Ivan", "Priya", "Jonas")
ITEMS = ("apples", "marbles", "books", "stickers", "cookies", "pencils", "coins", "cards")

_FAMILY_SHARES = (("instructions", 0.45), ("code", 0.25), ("math", 0.2), ("follow_ups", 0.1))


def instruction_prompts(rng: random.Random, count: int) -> list[str]:
  out = []
  for _ in range(count):
    topic, topic2 = rng.sample(TOPICS, 2)
    out.append(rng.choice(INSTRUCTION_TEMPLATES).format(
        topic=topic, topic2=topic2, audience=rng.choice(AUDIENCES),
        character=rng.choice(CHARACTERS), situation=rng.choice(SITUATIONS),
        recipient=rng.choice(RECIPIENTS), email_subject=rng.choice(EMAIL_SUBJECTS),
        activity=rng.choice(ACTIVITIES)))
  return out


def stdlib_functions() -> list[tuple[str, str, str]]:
  """(qualified name, signature text, docstring summary) of documented stdlib functions."""
  out = []
  for module_name in CODE_MODULES:
    module = importlib.import_module(module_name)
    for name, obj in sorted(vars(module).items()):
      if name.startswith("_") or not callable(obj) or inspect.isclass(obj):
        continue
      home = str(getattr(obj, "__module__", None) or module_name).lstrip("_")
      if home in CODE_MODULES and home != module_name:  # re-exported from another listed module
        continue
      summary = (inspect.getdoc(obj) or "").strip().split("\n\n")[0].replace("\n", " ")
      if not (10 <= len(summary) <= 300):
        continue
      try:
        # Default values like <function copy2 at 0x7f...> print a memory address, which would
        # make the prompts (and so the dataset) differ from one process to the next.
        signature = re.sub(r" at 0x[0-9a-fA-F]+", "", str(inspect.signature(obj)))
      except (TypeError, ValueError):
        signature = "(...)"
      out.append((f"{module_name}.{name}", signature, summary))
  return out


def code_prompts(rng: random.Random, count: int) -> list[str]:
  functions = stdlib_functions()
  out = []
  for _ in range(count):
    if rng.random() < 0.8:
      qualname, signature, summary = rng.choice(functions)
      out.append(rng.choice(CODE_TEMPLATES).format(qualname=qualname, signature=signature,
                                                   summary=summary))
    else:
      out.append(rng.choice(PROCEDURAL_CODE).format(k=rng.randint(2, 9)))
  return out


def _math_prompt(rng: random.Random) -> str:
  a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(2, 12)
  name, other = rng.sample(NAMES, 2)
  item = rng.choice(ITEMS)
  kind = rng.randrange(8)
  if kind == 0:
    return f"What is {a} * {b}? Show your steps."
  if kind == 1:
    return f"What is {a} + {b} * {c}? Explain the order of operations."
  if kind == 2:
    return f"Solve for x: {c}x + {b} = {c * a + b}. Show each step."
  if kind == 3:
    return f"What is {b}% of {a * 10}? Explain how you calculated it."
  if kind == 4:
    return (f"{name} has {a} {item} and gives {c} {item} to each of {b % 9 + 2} friends. "
            f"How many {item} does {name} have left?")
  if kind == 5:
    return (f"A train travels {a} km in {c} hours. What is its average speed? "
            f"How far would it go in {c + b % 5} hours at the same speed?")
  if kind == 6:
    return (f"{name} is {c + 10} years old and {other} is {b % 7 + 2} years older. "
            f"How old will {other} be in {c} years?")
  return (f"A shop sells {item} at {b} cents each. {name} buys {c} and pays with a "
          f"{(b * c // 100 + 1) * 100}-cent note. How much change does {name} get?")


def math_prompts(rng: random.Random, count: int) -> list[str]:
  return [_math_prompt(rng) for _ in range(count)]


def follow_up_prompts(rng: random.Random, count: int) -> list[str]:
  previous = instruction_prompts(rng, count)
  return [rng.choice(FOLLOW_UP_TEMPLATES).format(previous=p.rstrip("."),
                                                 audience=rng.choice(AUDIENCES))
          for p in previous]


_FAMILIES = {"instructions": instruction_prompts, "code": code_prompts, "math": math_prompts,
             "follow_ups": follow_up_prompts}


def build_training_prompts(num: int, seed: int = 0) -> list[str]:
  """`num` distinct prompts, families mixed by fixed shares, shuffled; deterministic per seed.

  Raises ValueError if the templates cannot produce `num` distinct prompts.
  """
  if num <= 0:
    raise ValueError(f"num must be positive, got {num}")
  rng = random.Random(seed)
  prompts: list[str] = []
  seen: set[str] = set()
  for family, share in _FAMILY_SHARES:
    want = round(num * share) if family != _FAMILY_SHARES[-1][0] else num - len(prompts)
    got: list[str] = []
    for _ in range(20):  # draw in rounds; duplicates are dropped, so ask for a few extra
      for p in _FAMILIES[family](rng, 2 * (want - len(got)) + 8):
        if p not in seen and len(got) < want:
          seen.add(p)
          got.append(p)
      if len(got) == want:
        break
    else:
      raise ValueError(f"could not build {want} distinct {family} prompts")
    prompts.extend(got)
  rng.shuffle(prompts)
  return prompts


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num", type=int, default=1000)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", help="write JSON lines {\"prompt\": ...} here (default: stdout)")
  args = parser.parse_args(argv)
  prompts = build_training_prompts(args.num, args.seed)
  lines = [json.dumps({"prompt": p}) for p in prompts]
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
    print(f"wrote {len(prompts)} prompts to {args.out}", file=sys.stderr)
  else:
    print("\n".join(lines))


if __name__ == "__main__":
  main()
