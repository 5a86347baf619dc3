#!/usr/bin/env python3
"""Builds the prompt set that EAGLE-3 training data is regenerated from (no download).

Three kinds, mixed in a fixed shuffled order so that `--limit N` downstream takes a mix:
  chat     topics x question/task templates
  code     programming tasks x languages
  grounded rewrite / summarise / extract / continue tasks over passages: paragraphs of the
           project's own documentation (README.md) and short passages composed from templates

Prompts equal to or containing one of the benchmark prompts (tools/bench_prompts.jsonl) are left
out, so the benchmark stays held out. Output: JSON lines {"id", "category", "prompt"}.

    python3 tools/make_prompts.py --out data/prompts.jsonl [--count N] [--seed S]
"""
import argparse
import json
import os
import random
import re
import sys

TOPICS = [
    "photosynthesis", "black holes", "the French Revolution", "machine learning", "climate change",
    "the human immune system", "volcanoes", "the stock market", "electric cars", "the Roman Empire",
    "coffee", "honey bees", "the internet", "vaccines", "solar panels", "the water cycle", "chess",
    "jazz music", "the Moon landing", "earthquakes", "meditation", "recycling", "the printing press",
    "dinosaurs", "rainforests", "compound interest", "the Olympic Games", "sleep", "bread baking",
    "the Great Wall of China", "quantum computing", "tea", "glaciers", "democracy", "the heart",
    "electricity", "gardening", "public libraries", "bicycles", "the periodic table", "ocean tides",
    "DNA", "the Renaissance", "smartphones", "coral reefs", "inflation", "marathon running",
    "the solar system", "antibiotics", "origami", "wind turbines", "the ancient Egyptians",
    "time management", "birds' migration", "cheese making", "the Silk Road", "robotics",
    "nutrition", "public speaking", "the Amazon river", "password security", "volunteering",
    "the theory of evolution", "mountain climbing", "podcasts", "city planning", "friendship",
    "learning a new language", "budgeting", "the Industrial Revolution", "photography",
    "camping", "operating systems", "databases", "cloud computing", "open source software",
    "first aid", "composting", "the night sky", "hurricanes", "museums", "board games",
    "the metric system", "job interviews", "remote work", "healthy breakfasts", "penguins",
]

CHAT_TEMPLATES = [
    "What is {t}? Explain it simply.",
    "Explain {t} to a ten-year-old.",
    "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Summarize the history of {t} in a few sentences.",
    "Write a haiku about {t}.",
    "Write a short poem about {t}.",
    "What are common misconceptions about {t}?",
    "How would you explain {t} to someone who has never heard of it?",
    "List five questions a student might ask about {t}.",
    "Why is {t} important?",
    "Write a two-sentence story involving {t}.",
    "Describe {t} in one sentence.",
    "What should a beginner know about {t}?",
    "Give me a fun fact about {t} and explain why it is true.",
    "Compare {t} with something from everyday life.",
    "Write a short dialogue between a teacher and a student about {t}.",
    "What are three tips for learning more about {t}?",
    "Write a tweet about {t}.",
    "Explain how {t} works, step by step.",
    "What would the world be like without {t}?",
    "Write a short quiz with three questions about {t}, with answers.",
    "Give a brief definition of {t} and an example.",
    "Write an encouraging message to someone who is curious about {t}.",
    "What are the key terms someone should know about {t}?",
    "Tell me something surprising about {t}.",
    "Write a short product description for a book about {t}.",
]

LANGUAGES = ["Python", "C", "C++", "JavaScript", "Java", "Rust", "Go", "Bash"]
CODE_TASKS = [
    "a function that returns the largest element of a list",
    "a function that counts the vowels in a string",
    "a function that checks whether a number is prime",
    "a function that reverses a linked list",
    "a function that computes the factorial of n recursively",
    "a function that merges two sorted arrays",
    "a function that removes duplicates from a list",
    "a function that converts Celsius to Fahrenheit",
    "a binary search function",
    "a function that returns the sum of the digits of an integer",
    "a function that checks whether two strings are anagrams",
    "a function that computes the greatest common divisor of two numbers",
    "a function that flattens a nested list",
    "a function that counts word frequencies in a text",
    "a function that validates an email address with simple rules",
    "a function that rotates an array by k positions",
    "a function that returns the n-th triangular number",
    "a function that transposes a matrix",
    "a function that finds the longest word in a sentence",
    "a function that implements bubble sort",
    "a stack class with push, pop and peek",
    "a function that capitalizes the first letter of every word",
    "a function that checks whether a year is a leap year",
    "a function that returns the running average of a list of numbers",
    "a function that parses a comma-separated line into fields",
    "a function that computes the dot product of two vectors",
    "a function that converts a decimal number to binary",
    "a simple queue built from two stacks",
    "a function that finds the missing number in a list from 1 to n",
    "a function that counts the lines of a text file",
]
CODE_TEMPLATES = [
    "Write {task} in {lang}.",
    "Write {task} in {lang} and explain how it works.",
    "In {lang}, implement {task}. Add a short comment.",
]
SQL_TASKS = [
    "returns all customers from a table named customers whose city is Paris",
    "counts the orders per customer in a table named orders",
    "returns the average salary per department from a table named employees",
    "deletes rows older than 30 days from a table named logs",
    "joins a table named books with a table named authors on author_id",
    "returns the five most expensive products from a table named products",
]

GROUNDED_TEMPLATES = [
    "Summarize the following text in one sentence:\n\n{p}",
    "Summarize the following text in two sentences:\n\n{p}",
    "Rewrite the following text in simpler words:\n\n{p}",
    "Rewrite the following text in the past tense:\n\n{p}",
    "List the key points of the following text:\n\n{p}",
    "Give the following text a short title:\n\n{p}",
    "Repeat the following text exactly:\n\n{p}",
    "Turn the following text into a bulleted list:\n\n{p}",
    "What is the main idea of the following text?\n\n{p}",
    "Write one question that the following text answers, and answer it:\n\n{p}",
]

NAMES = ["Ada", "Bruno", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena"]
PLACES = ["a small town", "a busy city", "a mountain village", "a harbour", "a university campus", "an island"]
JOBS = ["baker", "engineer", "teacher", "nurse", "farmer", "librarian", "pilot", "carpenter"]
PASSAGE_TEMPLATES = [
    "{n} works as a {j} in {pl}. Every morning {n} starts before sunrise, because the first hours of the day are "
    "the quietest. Over the years {n} has learned that small habits, repeated every day, matter more than big plans.",
    "In {pl}, the new {j} named {n} proposed a simple change: meetings would end after twenty minutes. At first "
    "people complained, but within a month most of them agreed that they finished more work and felt less tired.",
    "{n} keeps a notebook of every mistake made as a {j}. Each entry has the date, what went wrong and what to do "
    "next time. Reading the notebook at the end of the year, {n} noticed that most mistakes came from hurrying.",
    "When the storm reached {pl}, {n}, a {j}, helped neighbours carry supplies to the school gym. The power was "
    "out for two days, yet nobody went without food, because everyone shared what they had.",
    "The {j} {n} from {pl} started a weekend class for children. The class has no tests and no grades; the "
    "children build things, break them, and explain to each other what they learned.",
]


def readme_paragraphs(root):
    path = os.path.join(root, "README.md")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return []
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(line.strip() for line in para.splitlines())
        if para.startswith(("#", "|", "-", "*", ">")) or "`" in para:
            continue
        words = para.split()
        if 25 <= len(words) <= 120:
            out.append(para)
    return out


def build(root, seed):
    rng = random.Random(seed)
    prompts = []
    for t in TOPICS:
        for tpl in CHAT_TEMPLATES:
            prompts.append(("chat", tpl.format(t=t)))
    for lang in LANGUAGES:
        for task in CODE_TASKS:
            prompts.append(("code", rng.choice(CODE_TEMPLATES).format(task=task, lang=lang)))
    for task in SQL_TASKS:
        prompts.append(("code", f"Write a SQL query that {task}."))
    passages = readme_paragraphs(root)
    for n in NAMES:
        for tpl in PASSAGE_TEMPLATES:
            passages.append(tpl.format(n=n, j=rng.choice(JOBS), pl=rng.choice(PLACES)))
    for p in passages:
        for tpl in rng.sample(GROUNDED_TEMPLATES, 4):
            prompts.append(("grounded", tpl.format(p=p)))
    rng.shuffle(prompts)
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the JSON-lines file to write")
    ap.add_argument("--count", type=int, default=0, help="keep the first N prompts of the shuffled set (0 = all)")
    ap.add_argument("--seed", type=int, default=1, help="the shuffle's seed (default 1)")
    args = ap.parse_args()
    if args.count < 0:
        sys.exit("make_prompts: error: --count must be >= 0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    held_out = set()
    bench = os.path.join(root, "tools", "bench_prompts.jsonl")
    with open(bench, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                held_out.add(" ".join(json.loads(line)["prompt"].lower().split()))
    kept = []
    for cat, text in build(root, args.seed):
        norm = " ".join(text.lower().split())
        if any(h in norm or norm in h for h in held_out):
            continue
        kept.append((cat, text))
    if args.count:
        kept = kept[: args.count]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for i, (cat, text) in enumerate(kept):
            f.write(json.dumps({"id": f"{cat}-{i:05d}", "category": cat, "prompt": text}) + "\n")
    os.replace(tmp, args.out)
    counts = {}
    for cat, _ in kept:
        counts[cat] = counts.get(cat, 0) + 1
    print(f"make_prompts: {len(kept)} prompts ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}) -> {args.out}")


if __name__ == "__main__":
    main()
