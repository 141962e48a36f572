"""gsm8k_mc's documents: the first PROBLEMS GSM8K test problems, each with four distinct numbers to choose from."""

PROBLEMS = 40
CHOICES = 4


def reference(answer: str) -> str:
    """The number after GSM8K's ``####``, without thousands separators; ValueError if there is none."""
    head, sep, number = answer.rpartition("####")
    if not sep or not number.strip():
        raise ValueError(f"a GSM8K answer must end in '#### <number>', got {answer[-60:]!r}")
    return number.strip().replace(",", "")


def process_docs(dataset):
    """The first PROBLEMS documents of ``dataset`` (GSM8K records), each given ``choices`` (its reference
    number and the next problems' distinct numbers, cyclically) and ``label`` (i mod CHOICES for problem i)."""
    rows = dataset.select(range(min(PROBLEMS, len(dataset))))
    numbers = [reference(a) for a in rows["answer"]]
    if len(set(numbers)) < CHOICES:
        raise ValueError(f"gsm8k_mc needs at least {CHOICES} distinct reference numbers, got {sorted(set(numbers))}")

    def choose(doc, i):
        others = []
        for j in range(1, len(numbers)):
            candidate = numbers[(i + j) % len(numbers)]
            if candidate != numbers[i] and candidate not in others:
                others.append(candidate)
            if len(others) == CHOICES - 1:
                break
        label = i % CHOICES
        return {"choices": others[:label] + [numbers[i]] + others[label:], "label": label}

    return rows.map(choose, with_indices=True)
