#!/usr/bin/env python3
"""Builds the prompt set that EAGLE-3 training data is regenerated from (no download).

Three kinds, mixed in a fixed shuffled order so that `--limit N` downstream takes a mix:
  chat     topics x question/task templates
  code     programming tasks x languages
  grounded rewrite / summarise / extract / continue tasks over passages: paragraphs of the
           project's own documentation (training/prompt_passages.txt, frozen from README.md) and
           short passages composed from templates

Prompts equal to or containing one of the benchmark prompts (cli/bench_prompts.jsonl) are left
out, so the benchmark stays held out. Output: JSON lines {"id", "category", "prompt"}.

    python3 training/make_prompts.py --out data/prompts.jsonl [--count N] [--seed S]
"""
import argparse
import json
import os
import random
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

# The second, more varied part (`--part varied`): everyday questions in many phrasings, advice,
# concepts from computing and science, short poems about scenes, simple facts, letters and plans.
# A head trained on the first part alone accepted 0.65 of its first drafts on prompts like its
# training prompts but 0.40-0.46 on the benchmark's: the first part's 28 templates over 85 topics
# are too narrow a distribution.
COMPUTING_CONCEPTS = [
    "a linked list", "recursion", "an API", "a compiler", "a CPU cache", "TCP", "public-key encryption",
    "version control with git", "a binary tree", "a database index", "a race condition", "garbage collection",
    "an operating system kernel", "a virtual machine", "DNS", "HTTP", "a REST API", "a neural network",
    "gradient descent", "overfitting", "a hash function", "big-O notation", "a queue", "a stack",
    "a mutex", "a thread", "a process", "an interpreter", "unit testing", "a regular expression",
    "JSON", "a pointer", "a closure", "object-oriented programming", "functional programming",
    "a sorting algorithm", "a graph", "Dijkstra's algorithm", "a load balancer", "a container",
    "a firewall", "two-factor authentication", "a spreadsheet formula", "a URL", "bandwidth",
    "latency", "an SSD", "RAM", "a GPU", "Unicode", "a checksum", "a cookie in a web browser",
]
OTHER_CONCEPTS = [
    "supply and demand", "opportunity cost", "a mortgage", "an index fund", "gravity", "friction",
    "an atom", "a chemical reaction", "evaporation", "a food chain", "natural selection", "a virus",
    "a gene", "the greenhouse effect", "an eclipse", "a light year", "momentum", "energy conservation",
    "a fraction", "a prime number", "probability", "an average", "a percentage", "a right triangle",
    "the Pythagorean theorem", "a metaphor", "a thesis statement", "the scientific method", "a hypothesis",
    "a budget", "a credit score", "a contract", "a vaccine trial", "a placebo", "an ecosystem",
]
ACTIVITIES = [
    "staying productive at home", "learning to cook", "saving money", "sleeping better", "starting to run",
    "writing a good essay", "preparing for an exam", "making new friends", "keeping a plant alive",
    "reading more books", "learning to play the guitar", "staying calm before a presentation",
    "organizing a small closet", "planning a trip on a budget", "drinking more water", "waking up early",
    "learning to code", "taking better notes", "writing a cover letter", "keeping a journal",
    "reducing screen time", "eating more vegetables", "training a puppy", "painting with watercolors",
    "studying a foreign language", "working in a team", "giving feedback", "handling stress at work",
    "cleaning the kitchen quickly", "remembering names", "speaking up in meetings", "moving to a new city",
    "starting a small business", "riding a bike in traffic", "taking care of a cat", "baking cookies",
    "keeping a tidy desk", "staying motivated to exercise", "writing clean code", "debugging a program",
    "learning math as an adult", "choosing a laptop", "packing for a weekend trip", "hosting a dinner party",
    "making a good first impression", "avoiding procrastination", "studying with friends", "growing tomatoes",
    "practicing mindfulness", "writing a short story", "staying safe online", "teaching a child to read",
]
SCENES = [
    "the first snow of winter", "a rainy afternoon", "the sea at dawn", "a quiet library", "a city at night",
    "a mountain lake", "spring flowers", "a cup of hot tea", "an old oak tree", "a thunderstorm",
    "a summer evening", "the full moon", "a busy train station", "a cat sleeping in the sun", "falling rain",
    "a lighthouse", "a desert at noon", "a forest path", "a birthday party", "the smell of fresh bread",
    "a frozen pond", "a garden in summer", "the last day of school", "a long road trip", "morning fog",
    "a river in spring", "the stars over a campfire", "a snowman", "a windy beach", "the sound of the ocean",
]
STYLES = ["a haiku", "a short poem", "a limerick", "a four-line rhyme", "two sentences of vivid description",
          "a short story of three sentences", "a riddle"]
COUNTRIES = [
    "Japan", "Brazil", "Canada", "Kenya", "Norway", "Italy", "Egypt", "India", "Mexico", "Australia",
    "Germany", "Spain", "Peru", "Vietnam", "Greece", "Sweden", "Argentina", "Morocco", "Portugal",
    "Thailand", "Ireland", "Poland", "Chile", "Turkey", "New Zealand", "South Korea", "Ghana", "Austria",
]
ANIMALS = ["an octopus", "an elephant", "a penguin", "a honey bee", "a dolphin", "an owl", "a spider",
           "a giraffe", "a shark", "a bat", "a frog", "a camel", "a kangaroo", "a snail", "a hummingbird"]
SUFFIXES = ["", "", "", " Keep it short.", " Answer in one or two sentences.", " Be concise.",
            " Use simple words.", " Use a list.", " Explain your reasoning."]
CONCEPT_TEMPLATES = [
    "What is {c}?", "Explain {c} in simple terms.", "Can you explain {c} to someone new to the subject?",
    "What is {c} and why does it matter?", "Give an everyday analogy for {c}.",
    "Describe {c} to a beginner, with one example.", "What problem does {c} solve?",
    "How would a teacher explain {c} in a first lesson?", "I keep hearing about {c}. What is it?",
    "Explain {c} in three sentences.", "What are the most common mistakes people make with {c}?",
]
ACTIVITY_TEMPLATES = [
    "Give me three tips for {a}.", "Give me five tips for {a}.", "What is the best way to get started with {a}?",
    "I want to get better at {a}. Where should I begin?", "What are common mistakes when {a}?",
    "Make a simple one-week plan for {a}.", "Why do people find {a} hard, and what helps?",
    "Give me two pieces of advice about {a}.", "What habits help with {a}?",
    "Write a short checklist for {a}.",
]
FACT_TEMPLATES = [
    "What is the capital of {x}?", "What language do people speak in {x}?", "Name a famous landmark in {x}.",
    "What is {x} known for?", "What currency is used in {x}?", "Tell me one interesting fact about {x}.",
]
ANIMAL_TEMPLATES = [
    "How does {x} find food?", "Where does {x} live?", "Tell me a surprising fact about {x}.",
    "How long does {x} live?", "Describe {x} in two sentences.",
]
WRITING_TASKS = [
    "Write a short thank-you note to a neighbour who watered my plants.",
    "Write a polite email asking my manager for a day off next Friday.",
    "Write a short birthday message for a friend who loves hiking.",
    "Write a two-sentence apology for arriving late to a meeting.",
    "Write a short invitation to a picnic in the park on Saturday.",
    "Write a short message congratulating a colleague on a promotion.",
    "Write a brief review of a fictional coffee shop.",
    "Write a short welcome message for new members of a book club.",
    "Write a motivational sentence for someone starting a new job.",
    "Write a short note reminding my roommate to take out the trash.",
    "Write a friendly reply declining an invitation to a party.",
    "Write a short speech to open a school science fair.",
    "Write a one-paragraph story about a robot that learns to paint.",
    "Write a short joke about computers.",
    "Write a slogan for a bakery.",
    "Write a short description of a sunny kitchen.",
    "Suggest three names for a pet goldfish.",
    "Suggest a simple dinner I can cook in twenty minutes.",
    "Suggest five fun activities for a rainy weekend.",
    "Suggest three books for someone who likes science.",
    "What should I pack for a day at the beach?",
    "How do I boil an egg?",
    "How many minutes are there in a day?",
    "Why is the sky blue?",
    "Why do leaves change color in the fall?",
    "How do airplanes stay in the air?",
    "What causes rainbows?",
    "Why do we have seasons?",
    "What is the difference between weather and climate?",
    "What is the difference between a virus and a bacterium?",
    "What is the difference between a list and a tuple in Python?",
    "What is the difference between RAM and storage?",
    "Is it better to study in the morning or at night?",
    "How can I tell if an egg is fresh?",
    "What does a good breakfast look like?",
    "How do I write a good to-do list?",
    "What are the planets in our solar system?",
    "Who invented the telephone?",
    "How does a refrigerator keep food cold?",
    "How do I convert kilometers to miles?",
]

MORE_ACTIVITIES = [
    "learning to swim", "writing a resume", "negotiating a salary", "running a meeting", "buying a used car",
    "making coffee at home", "learning to draw", "caring for houseplants in winter", "sticking to a budget",
    "cooking rice", "planning a wedding on a budget", "studying for a driving test", "getting over jet lag",
    "learning to touch type", "making a podcast", "shooting better phone photos", "keeping bees",
    "starting a vegetable garden", "reading faster", "writing a poem", "learning chess openings",
    "teaching a class for the first time", "volunteering at a shelter", "moving house", "decluttering",
    "asking for help at work", "preparing for a job interview", "taking a gap year", "hiking safely",
    "cycling to work", "making bread by hand", "learning a musical instrument as an adult",
    "getting a good night's sleep before an exam", "keeping in touch with old friends", "meal prepping",
    "writing documentation for code", "reviewing a pull request", "learning SQL", "setting goals",
    "working from a cafe", "managing email", "speaking to a large audience",
]
PAIRS = [
    ("a cat", "a dog"), ("tea", "coffee"), ("Python", "JavaScript"), ("a laptop", "a desktop"),
    ("renting", "buying a home"), ("walking", "running"), ("a lake", "a sea"), ("weather", "climate"),
    ("a list", "a dictionary"), ("HTTP", "HTTPS"), ("a virus", "a bacterium"), ("a star", "a planet"),
    ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("a debit card", "a credit card"),
    ("a comet", "an asteroid"), ("speed", "velocity"), ("mass", "weight"), ("a compiler", "an interpreter"),
    ("RAM", "a hard disk"), ("a process", "a thread"), ("an ocean", "a sea"), ("fruit", "vegetables"),
    ("stocks", "bonds"), ("a poem", "a song"), ("a novel", "a short story"), ("TCP", "UDP"),
    ("git merge", "git rebase"), ("a monkey", "an ape"), ("a butterfly", "a moth"), ("summer", "winter"),
]
PAIR_TEMPLATES = [
    "What is the difference between {x} and {y}?", "Compare {x} and {y} in a few sentences.",
    "Which is better for a beginner, {x} or {y}?", "Give one similarity and one difference between {x} and {y}.",
]
THINGS = ["fruits", "vegetables", "musical instruments", "board games", "programming languages", "rivers in Europe",
          "famous painters", "sports played with a ball", "animals that live in the ocean", "breakfast foods",
          "ways to save energy at home", "kinds of clouds", "renewable energy sources", "kitchen tools",
          "birds", "planets", "healthy snacks", "jobs that work outdoors", "things to do in a park",
          "reasons to learn history", "uses of a smartphone", "inventions of the 20th century",
          "classic novels", "types of bridges", "ways to reduce waste", "desserts", "team sports", "spices"]
THING_TEMPLATES = ["Name five {x}.", "List three {x} and say one thing about each.", "What are some {x}?",
                   "Give me a list of {x}."]
CHAT_EXTRA_TEMPLATES = [
    "Tell me about {t}.", "What is {t}? Answer in a short paragraph.", "Why do people care about {t}?",
    "Give me a simple explanation of {t}.", "What is the most important thing to know about {t}?",
    "Write a short introduction to {t} for a school newsletter.", "How has {t} changed over time?",
    "What are two myths about {t}?", "Explain {t} like I am a beginner.",
]

# The third part (`--part more`): families the first two lack — how-to steps, explanations for a
# named audience, word meanings, people and books, small arithmetic, stories with a character and
# an event, recommendations, questions with a situation given first, and code how-to questions.
HOWTO_TASKS = [
    "change a flat bicycle tire", "make a cup of green tea", "set up a Python virtual environment",
    "back up the photos on my phone", "reset a home Wi-Fi router", "iron a shirt", "clean a laptop keyboard",
    "write a unit test", "install a new app on a laptop", "plant a tree", "make a paper airplane",
    "sew a button back on", "make pancakes", "cook pasta", "jump-start a car", "write a thank-you card",
    "prepare for a long flight", "fold a fitted sheet", "remove a coffee stain", "create a strong password",
    "read a nutrition label", "start a compost bin", "make a budget spreadsheet", "tie a tie",
    "clean a cast iron pan", "measure the area of a room", "take a screenshot on a computer",
    "learn the multiplication table", "make a simple website", "write a recipe card", "frame a picture",
    "wash a wool sweater", "fix a squeaky door", "brew coffee with a French press", "build a campfire safely",
    "choose a ripe avocado", "start a conversation with a stranger", "write a limerick", "learn to juggle",
    "memorize a short speech", "pack a lunch for school", "care for a sourdough starter",
    "organize files on a computer", "prepare a presentation", "calm down after an argument",
    "make a cheap healthy dinner", "set up a fish tank", "find a good book to read", "write a commit message",
    "rename many files at once", "use a command line terminal", "learn keyboard shortcuts",
]
HOWTO_TEMPLATES = [
    "How do I {t}?", "What are the steps to {t}?", "Walk me through how to {t}.",
    "I have never tried to {t}. How should I do it?", "What is the easiest way to {t}?",
    "Explain how to {t} in a few steps.",
]
AUDIENCES = ["a ten-year-old", "my grandmother", "a high school student", "a new employee",
             "someone who has never used a computer", "a friend over coffee", "a university student"]
MORE_CONCEPTS = [
    "photosynthesis", "inflation", "the water cycle", "electric current", "DNA", "plate tectonics",
    "compound interest", "machine learning", "encryption", "climate change", "a solar panel", "a black hole",
    "democracy", "the internet", "a vaccine", "the immune system", "a volcano", "the moon's phases",
    "a battery", "magnetism", "sound waves", "a recession", "taxes", "a loan", "a calendar year",
    "cloud computing", "a search engine", "a password manager", "open source software", "a blog",
    "an election", "the stock market", "a museum", "a library card", "a time zone", "the metric system",
    "a map scale", "a thermometer", "a microscope", "a telescope", "erosion", "tides", "a hurricane",
]
EXPLAIN_TEMPLATES = [
    "Explain {c} to {a}.", "How would you explain {c} to {a}?", "Describe {c} so that {a} understands it.",
]
WORDS = [
    "serendipity", "ephemeral", "resilient", "meticulous", "ambiguous", "nostalgia", "pragmatic",
    "candid", "diligent", "eloquent", "frugal", "gregarious", "humble", "inevitable", "jubilant",
    "lucid", "mundane", "novice", "obsolete", "persevere", "quaint", "reluctant", "skeptical",
    "tedious", "vivid", "whimsical", "zealous", "benevolent", "concise", "abundant", "curious",
    "generous", "hesitant", "optimistic", "patient", "rigorous", "subtle", "tranquil", "versatile",
]
WORD_TEMPLATES = [
    "What does the word '{w}' mean?", "Use the word '{w}' in a sentence.", "Give a synonym and an antonym for '{w}'.",
    "Define '{w}' and give an example.",
]
PEOPLE = [
    "Marie Curie", "Albert Einstein", "Isaac Newton", "Ada Lovelace", "Leonardo da Vinci", "William Shakespeare",
    "Charles Darwin", "Galileo Galilei", "Nelson Mandela", "Mahatma Gandhi", "Alan Turing", "Frida Kahlo",
    "Wolfgang Amadeus Mozart", "Jane Austen", "Nikola Tesla", "Rosalind Franklin", "Cleopatra",
    "Martin Luther King Jr.", "Grace Hopper", "Ludwig van Beethoven", "Pablo Picasso", "Florence Nightingale",
    "Thomas Edison", "Amelia Earhart", "Confucius", "Aristotle", "Vincent van Gogh", "Katherine Johnson",
]
PERSON_TEMPLATES = ["Who was {p}?", "What is {p} famous for?", "Tell me three facts about {p}.",
                    "Why is {p} important in history?"]
BOOKS = [
    "Romeo and Juliet", "Cinderella", "The Hobbit", "Pride and Prejudice", "Little Red Riding Hood",
    "The Tortoise and the Hare", "Moby-Dick", "Alice in Wonderland", "Treasure Island", "Hamlet",
    "The Three Little Pigs", "Robinson Crusoe", "The Little Prince", "Frankenstein", "Peter Pan",
    "The Ugly Duckling", "Jack and the Beanstalk", "Don Quixote", "The Odyssey", "Snow White",
]
BOOK_TEMPLATES = ["Summarize the story of {b}.", "What is the main lesson of {b}?", "Who are the main characters in {b}?"]
CHARACTERS = ["a shy dragon", "a curious robot", "an old fisherman", "a lost puppy", "a young wizard",
              "a brave mouse", "a tired astronaut", "a kind baker", "a talking tree", "a clever fox",
              "a girl who loves maps", "a retired teacher", "a tiny snail", "a forgetful inventor"]
EVENTS = ["finds a secret door", "makes a new friend", "gets lost in a big city", "wins a contest",
          "learns to fly", "discovers a hidden garden", "has to solve a mystery", "goes to the moon",
          "loses a favorite hat", "helps a stranger", "starts a new school", "opens a small shop"]
MATH_TEMPLATES = [
    "If I have {a} apples and give away {b}, how many are left?", "What is {a} plus {b}?",
    "What is {a} times {b}?", "A book costs {a} dollars. How much do {b} books cost?",
    "If a train travels {a} kilometers per hour for {b} hours, how far does it go?",
    "What is {a} percent of 200?",
]
RECOMMEND = [
    ("three", "movies", "a family evening"), ("five", "snacks", "a long hike"), ("three", "hobbies", "a quiet person"),
    ("four", "apps", "learning a language"), ("three", "games", "a group of children"),
    ("five", "gifts", "a coworker who likes tea"), ("three", "exercises", "someone who sits all day"),
    ("four", "houseplants", "a dark apartment"), ("three", "podcast topics", "a science fan"),
    ("five", "meals", "a busy week"), ("three", "tools", "a new programmer"), ("four", "books", "a teenager"),
    ("three", "destinations", "a winter holiday"), ("five", "questions", "a job interview"),
    ("three", "songs", "a road trip"), ("four", "habits", "a healthier morning"),
]
SITUATIONS = [
    ("I am a student with very little money.", ["How can I eat healthy?", "How can I save for a trip?",
                                                 "What can I do for fun on weekends?"]),
    ("I just moved to a new country.", ["How can I make friends?", "How do I learn the language faster?",
                                        "What should I do in my first week?"]),
    ("I work from home and feel lonely.", ["What can I do about it?", "How can I stay motivated?",
                                           "How should I plan my day?"]),
    ("My code keeps crashing with a null pointer error.", ["What should I check first?",
                                                             "How do I find the cause?"]),
    ("I have a job interview tomorrow.", ["How should I prepare tonight?", "What should I wear?",
                                          "What questions should I ask them?"]),
    ("I want to start running but I get tired quickly.", ["How should I begin?", "How often should I run?"]),
    ("My team missed a deadline.", ["How do I tell my manager?", "How can we avoid this next time?"]),
    ("I am learning to cook.", ["What should I make first?", "Which kitchen tools do I need?"]),
    ("My plants keep dying.", ["What am I doing wrong?", "Which plants are easy to keep?"]),
    ("I can't fall asleep at night.", ["What can I try?", "Should I stop drinking coffee?"]),
    ("I have to give a talk to fifty people.", ["How do I handle nerves?", "How long should I practice?"]),
    ("I want to learn programming.", ["Which language should I start with?", "How many hours a week should I study?"]),
]
CODE_HOWTO = [
    "read a text file line by line", "sort a list of numbers", "parse a JSON string", "make an HTTP request",
    "handle an error", "write a loop that counts to ten", "reverse a list", "find the largest number in a list",
    "remove duplicates from a list", "format a date", "check if a file exists", "split a string by commas",
    "define a class with two fields", "read input from the user", "write a function with a default argument",
    "convert a string to an integer", "join a list of strings", "measure how long a function takes",
]


def shipped_passages(root):
    """training/prompt_passages.txt: one passage per line (lines starting with '#' are comments)."""
    path = os.path.join(root, "training", "prompt_passages.txt")
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as e:
        sys.exit(f"make_prompts: error: {path}: cannot read ({e.strerror})")
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]

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
    passages = shipped_passages(root)
    for n in NAMES:
        for tpl in PASSAGE_TEMPLATES:
            passages.append(tpl.format(n=n, j=rng.choice(JOBS), pl=rng.choice(PLACES)))
    for p in passages:
        for tpl in rng.sample(GROUNDED_TEMPLATES, 4):
            prompts.append(("grounded", tpl.format(p=p)))
    rng.shuffle(prompts)
    return prompts


def build_varied(seed):
    """The second part: each family's prompts with a random suffix, capped per family for balance."""
    rng = random.Random(seed + 1000)
    out = []
    sfx = lambda: rng.choice(SUFFIXES)
    for c in COMPUTING_CONCEPTS + OTHER_CONCEPTS:
        for tpl in rng.sample(CONCEPT_TEMPLATES, 7):
            out.append(("chat", tpl.format(c=c) + sfx()))
    for t in TOPICS:  # the first part's topics in new phrasings
        for tpl in rng.sample(CHAT_EXTRA_TEMPLATES, 5):
            out.append(("chat", tpl.format(t=t) + sfx()))
    for x, y in PAIRS:
        for tpl in rng.sample(PAIR_TEMPLATES, 3):
            out.append(("chat", tpl.format(x=x, y=y) + sfx()))
    for x in THINGS:
        for tpl in rng.sample(THING_TEMPLATES, 3):
            out.append(("chat", tpl.format(x=x)))
    for a in ACTIVITIES + MORE_ACTIVITIES:
        for tpl in rng.sample(ACTIVITY_TEMPLATES, 7):
            out.append(("chat", tpl.format(a=a) + sfx()))
    for s in SCENES:
        for style in rng.sample(STYLES, 6):
            out.append(("chat", f"Write {style} about {s}."))
    for x in COUNTRIES:
        for tpl in rng.sample(FACT_TEMPLATES, 6):
            out.append(("chat", tpl.format(x=x) + sfx()))
    for x in ANIMALS:
        for tpl in rng.sample(ANIMAL_TEMPLATES, 5):
            out.append(("chat", tpl.format(x=x) + sfx()))
    for w in WRITING_TASKS:
        out.append(("chat", w))
        out.append(("chat", w + rng.choice([" Keep it short.", " Make it cheerful.", " Use simple words."])))
    for c in COMPUTING_CONCEPTS:
        out.append(("code", f"Show a short {rng.choice(LANGUAGES)} example of {c}."))
    for lang in LANGUAGES:
        for task in rng.sample(CODE_TASKS, 12):
            out.append(("code", f"Write {task} in {lang}. Keep the code short." if rng.random() < 0.5 else
                        f"Please write {task} using {lang}, with a usage example."))
    rng.shuffle(out)
    return out


def build_more(seed):
    """The third part: new families (see the lists above), each with a random suffix where it fits."""
    rng = random.Random(seed + 2000)
    out = []
    sfx = lambda: rng.choice(SUFFIXES)
    for t in HOWTO_TASKS:
        for tpl in HOWTO_TEMPLATES:
            out.append(("chat", tpl.format(t=t) + sfx()))
    for c in MORE_CONCEPTS:
        for a in rng.sample(AUDIENCES, 3):
            out.append(("chat", rng.choice(EXPLAIN_TEMPLATES).format(c=c, a=a)))
        for tpl in rng.sample(CONCEPT_TEMPLATES, 6):
            out.append(("chat", tpl.format(c=c) + sfx()))
    for w in WORDS:
        for tpl in WORD_TEMPLATES:
            out.append(("chat", tpl.format(w=w)))
    for p in PEOPLE:
        for tpl in PERSON_TEMPLATES:
            out.append(("chat", tpl.format(p=p) + sfx()))
    for b in BOOKS:
        for tpl in BOOK_TEMPLATES:
            out.append(("chat", tpl.format(b=b) + sfx()))
    for ch in CHARACTERS:
        for ev in rng.sample(EVENTS, 8):
            out.append(("chat", f"Write a short story about {ch} who {ev}." +
                        rng.choice(["", " Keep it under 100 words.", " Give it a happy ending.", " Use simple words."])))
    for _ in range(120):
        tpl = rng.choice(MATH_TEMPLATES)
        out.append(("chat", tpl.format(a=rng.randint(2, 40), b=rng.randint(2, 12))))
    for n, things, who in RECOMMEND:
        out.append(("chat", f"Recommend {n} {things} for {who}."))
        out.append(("chat", f"What are {n} good {things} for {who}?" + sfx()))
    for situation, questions in SITUATIONS:
        for q in questions:
            out.append(("chat", f"{situation} {q}"))
            out.append(("chat", f"{situation} {q}" + rng.choice([" Keep it short.", " Give me a list.", " Be specific."])))
    for task in CODE_HOWTO:
        for lang in LANGUAGES:
            out.append(("code", rng.choice([f"How do I {task} in {lang}?", f"Show me how to {task} in {lang}.",
                                            f"In {lang}, what is the simplest way to {task}?"])))
    rng.shuffle(out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the JSON-lines file to write")
    ap.add_argument("--count", type=int, default=0, help="keep the first N prompts of the shuffled set (0 = all)")
    ap.add_argument("--seed", type=int, default=1, help="the shuffle's seed (default 1)")
    ap.add_argument("--part", choices=["all", "base", "varied", "more"], default="all",
                    help="base: the first set (topics x templates, code, passages); varied: the second, more "
                         "varied set; more: the third (how-to, audiences, words, people, stories, situations); "
                         "all (default): base, then varied, then more")
    args = ap.parse_args()
    if args.count < 0:
        sys.exit("make_prompts: error: --count must be >= 0")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    held_out = set()
    bench = os.path.join(root, "cli", "bench_prompts.jsonl")
    with open(bench, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                held_out.add(" ".join(json.loads(line)["prompt"].lower().split()))
    kept = []  # (id, category, text) over base, varied, more: a prompt's id is the same in every part
    seen = set()
    parts = (("base", build(root, args.seed)), ("varied", build_varied(args.seed)), ("more", build_more(args.seed)))
    for part, items in parts:
        for cat, text in items:
            norm = " ".join(text.lower().split())
            if norm in seen or any(h in norm or norm in h for h in held_out):
                continue  # a repeat (a varied prompt equal to a base one) or a benchmark prompt
            seen.add(norm)
            if args.part in ("all", part):
                kept.append((f"{cat}-{len(seen) - 1:05d}", cat, text))
    if args.count:
        kept = kept[: args.count]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for pid, cat, text in kept:
            f.write(json.dumps({"id": pid, "category": cat, "prompt": text}) + "\n")
    os.replace(tmp, args.out)
    counts = {}
    for _, cat, _ in kept:
        counts[cat] = counts.get(cat, 0) + 1
    print(f"make_prompts: {len(kept)} prompts ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}) -> {args.out}")


if __name__ == "__main__":
    main()
