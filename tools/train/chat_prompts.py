"""Chat-like training prompts from seed topics and question templates listed here (offline,
reproducible: the list depends on nothing but this file).

Every (topic, template) pair gives one prompt; the pairs are ordered by a hash so that any prefix
of the list mixes topics and question kinds. The benchmark's chat prompts (bench/spec_bench.cc:
the capital of France, language-learning tips, hash tables, a robot who paints) are not topics
here, and no template asks for the same thing.
"""
import hashlib

TOPICS = [
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "earthquakes", "tides",
    "the immune system", "vaccines", "sleep", "healthy breakfast", "running a marathon",
    "yoga", "meditation", "time management", "public speaking", "job interviews",
    "writing a resume", "saving money", "budgeting", "compound interest", "inflation",
    "the stock market", "starting a small business", "customer service", "email etiquette",
    "remote work", "team meetings", "giving feedback", "learning to code", "recursion",
    "sorting algorithms", "binary search", "databases", "version control with git",
    "unit testing", "the internet", "encryption", "passwords", "computer viruses",
    "cloud computing", "machine learning", "robots in factories", "electric cars",
    "solar panels", "wind energy", "recycling", "climate change", "composting", "gardening",
    "growing tomatoes", "houseplants", "baking bread", "making pasta", "brewing coffee",
    "green tea", "chocolate", "cooking rice", "vegetarian meals", "a picnic",
    "planning a trip", "packing a suitcase", "camping", "hiking safety", "the ocean",
    "whales", "bees", "dogs as pets", "cats", "birds migrating", "dinosaurs",
    "the Roman Empire", "ancient Egypt", "the printing press", "the moon landing",
    "the Olympic Games", "chess", "playing the guitar", "learning the piano", "painting",
    "photography", "reading more books", "writing poetry", "keeping a journal",
    "making friends", "moving to a new city", "a birthday party", "a rainy day",
    "winter", "the night sky", "rainbows", "clouds", "mountains", "deserts", "rivers",
    "libraries", "museums", "trains", "bicycles", "airplanes", "traffic safety",
    "first aid", "drinking water", "fractions", "percentages", "prime numbers", "geometry",
    "probability", "the scientific method", "magnets", "electricity", "light", "sound",
]

TEMPLATES = [
    "What is {t}? Explain it simply.",
    "Can you tell me about {t}?",
    "Give me three facts about {t}.",
    "Write a short paragraph about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are the pros and cons of {t}?",
    "List five tips about {t}.",
    "Write a short poem about {t}.",
    "Why is {t} important?",
    "What are common mistakes people make with {t}?",
    "Write a haiku about {t}.",
    "How would you describe {t} to a friend?",
    "Give a step-by-step guide related to {t}.",
    "What questions should a beginner ask about {t}?",
    "Write a short dialogue between two people talking about {t}.",
    "Summarize the most important ideas about {t} in a few sentences.",
]


# Evaluation prompts (--source chat-eval): topics and templates that share nothing with the lists
# above, so acceptance measured on them is what a new chat prompt gets, not what a new pairing of
# seen topics and seen questions gets (the held-out 10% of the training samples are such pairs).
EVAL_TOPICS = [
    "octopuses", "the French Revolution", "knitting", "thunderstorms", "coral reefs",
    "spreadsheets", "the human heart", "origami",
]

EVAL_TEMPLATES = [
    "I want to learn about {t}. Where should I start?",
    "Tell me something surprising about {t}.",
    "Describe {t} in a few sentences.",
]


def _hash_ordered(topics, templates):
    pairs = [(t, k) for t in topics for k in templates]
    pairs.sort(key=lambda p: hashlib.sha256((p[0] + "|" + p[1]).encode()).hexdigest())
    return [k.format(t=t) for t, k in pairs]


def prompts():
    return _hash_ordered(TOPICS, TEMPLATES)


def eval_prompts():
    return _hash_ordered(EVAL_TOPICS, EVAL_TEMPLATES)


if __name__ == "__main__":
    ps = prompts()
    print(len(ps))
    for p in ps[:10]:
        print(p)
