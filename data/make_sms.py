"""Writes data/sms.csv: 600 short text messages, spam or ham, for the review notebook.

Made here from hand-written phrases (no outside data; the SMS Spam Collection the benchmarks read is not copied
in), with a fixed seed, so the file is reproducible: `python data/make_sms.py`. Each message's `label` is the
truth a reviewer judges answers against.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

HAM = [
    "Are we still on for lunch {day}?",
    "Running {minutes} minutes late, sorry!",
    "Can you pick up {item} on the way?",
    "Happy birthday {name}! Have a great day.",
    "Did you see the match last night?",
    "Call me when you get home.",
    "Meeting moved to {time}, same room.",
    "Thanks for dinner, it was lovely.",
    "I left {item} at yours.",
    "Mum says hi. Dinner at {time}?",
    "On the train now, see you soon.",
    "Don't forget {item} tomorrow.",
    "Ok, {time} works for me.",
    "Just landed. Phone battery nearly dead.",
    "Can we talk about the rent {day}?",
]
SPAM = [
    "WINNER!! You have won a {prize}. Call {phone} now to claim.",
    "URGENT: your account is locked. Verify at {url}",
    "Congratulations {name}! Claim your free {prize} today: text WIN to {short}.",
    "You have been selected for a {amount} cash reward. Reply YES to {short}.",
    "FREE entry to win a {prize}! Txt GO to {short}. T&Cs apply.",
    "Your parcel delivery is on hold. Pay {amount} at {url}",
    "Final notice: unpaid {amount} fine. Reply PAY to {short} now.",
    "Hot singles near you! Txt CHAT to {short} now.",
    "Guaranteed loans approved in minutes. Call {phone}.",
    "Your {prize} is waiting: claim it {day} at {url}",
]
FILL = {
    "day": ["today", "tomorrow", "on Friday", "this weekend", "Monday"],
    "minutes": ["5", "10", "15", "20"],
    "item": ["milk", "the keys", "my charger", "bread", "the tickets", "your jacket"],
    "name": ["Sam", "Priya", "Tom", "Ana", "Leo", "Mia"],
    "time": ["7pm", "3:30", "noon", "half six", "8"],
    "prize": ["iPhone", "holiday to Spain", "£1000 voucher", "new car", "TV"],
    "phone": ["09061 701 461", "0800 555 0199", "07781 482 378"],
    "url": ["bit.ly/x7Qp", "secure-verify.co/login", "parcel-help.net/pay", "win-now.biz"],
    "short": ["87121", "80086", "69669"],
    "amount": ["£250", "£1,500", "£3.99", "$500"],
}


def message(rng: random.Random, templates: list[str]) -> str:
    text = rng.choice(templates)
    for field, choices in FILL.items():
        text = text.replace("{" + field + "}", rng.choice(choices))
    return text


def main() -> None:
    rng = random.Random(20261128)
    out = Path(__file__).with_name("sms.csv")
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["sms_id", "label", "text"])
        for i in range(1, 601):
            label = "spam" if rng.random() < 0.15 else "ham"
            writer.writerow([i, label, message(rng, SPAM if label == "spam" else HAM)])


if __name__ == "__main__":
    main()
