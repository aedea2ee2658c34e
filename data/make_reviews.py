"""Writes data/reviews.csv: 3,000 short product reviews for the demo.

The text is generated here from hand-written phrases (no outside data), with a
fixed seed, so the file is reproducible: `python data/make_reviews.py`.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

PRODUCTS = ["kettle", "blender", "desk lamp", "rice cooker", "backpack", "phone case", "headphones",
            "coffee grinder", "yoga mat", "water bottle", "air fryer", "keyboard", "toaster", "umbrella"]
OPENERS = {
    "positive": ["I love this {p}.", "Great {p}, does exactly what it says.", "Best {p} I have owned.",
                 "Really happy with this {p}.", "Excellent {p} for the price."],
    "negative": ["The {p} broke after two weeks.", "Disappointed with this {p}.", "Worst {p} I have bought.",
                 "The {p} arrived late and scratched.", "Poor quality {p}, asked for a refund."],
    "neutral": ["The {p} is okay.", "It is a {p}, nothing special.", "Average {p}.",
                "The {p} does the job, mostly.", "Bought this {p} as a replacement."],
}
DETAILS = {
    "positive": ["Shipping was fast and the box was tidy.", "Works perfectly every morning.",
                 "Would recommend it to friends.", "Easy to clean and feels solid.", "My kids love it too."],
    "negative": ["Customer service never answered my emails.", "It feels cheap and the lid is loose.",
                 "Stopped working after the first wash.", "Instructions were missing.", "Too slow to be useful."],
    "neutral": ["Colour is a bit darker than the photos.", "Setup took about ten minutes.",
                "I use it a few times a week.", "Packaging was plain.", "Price was similar elsewhere."],
}
CLOSERS = ["", "", "Five stars.", "Two stars.", "Might buy again.", "Returned it.", "Gift for my mother."]


def main(path: Path | None = None, rows: int = 3000, seed: int = 7) -> None:
    path = path or Path(__file__).with_name("reviews.csv")
    rng = random.Random(seed)
    with path.open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["review_id", "product", "stars", "text"])
        for i in range(1, rows + 1):
            mood = rng.choices(["positive", "negative", "neutral"], weights=[5, 3, 2])[0]
            product = rng.choice(PRODUCTS)
            parts = [rng.choice(OPENERS[mood]).format(p=product), *rng.sample(DETAILS[mood], k=rng.randint(1, 2)),
                     rng.choice(CLOSERS)]
            stars = {"positive": rng.randint(4, 5), "negative": rng.randint(1, 2), "neutral": 3}[mood]
            out.writerow([i, product, stars, " ".join(p for p in parts if p)])


if __name__ == "__main__":
    main()
