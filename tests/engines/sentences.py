"""Parity sentences: several languages and scripts, one word to well past 256 tokens."""

from __future__ import annotations

import random

import numpy as np

BASE = [
    # English
    "The quick brown fox jumps over the lazy dog.",
    "Replace the air filter every 500 operating hours or when the warning light turns on.",
    "Is the conveyor belt on line 3 running slower than usual?",
    "I can't believe it's already 2026!",
    "Temperature sensor T-104 reported 87.5 °C at 14:32 UTC.",
    "Please restart the controller, then check the hydraulic pressure.",
    "What is the capital of Australia?",
    "Machine learning models can run on embedded devices with limited memory.",
    "She sells sea shells by the sea shore.",
    "ERROR: disk quota exceeded (code 0x7F3A) - contact your administrator",
    # French, German, Spanish, Italian, Portuguese, Dutch, Polish, Czech, Turkish, Vietnamese
    "Le chat dort sur le canapé pendant que la pluie tombe.",
    "Où se trouve la gare la plus proche, s'il vous plaît ?",
    "Die Maschine muss vor der Wartung vollständig abgeschaltet werden.",
    "Grüße aus Köln – das Wetter ist heute schön.",
    "¿Dónde está el botón de parada de emergencia?",
    "El niño comió una manzana y después durmió la siesta.",
    "La produzione è ferma a causa di un guasto al motore.",
    "A manutenção preventiva reduz o tempo de inatividade.",
    "De vrachtwagen komt morgenochtend om acht uur aan.",
    "Zażółć gęślą jaźń — to zdanie zawiera polskie znaki.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Bakım sırasında koruyucu gözlük takınız.",
    "Tiếng Việt có nhiều dấu thanh điệu khác nhau.",
    # Cyrillic, Greek, Armenian, Georgian
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Температура двигателя превышает допустимое значение.",
    "Γειά σου κόσμε, τι κάνεις σήμερα;",
    "Բարև աշխարհ, ինչպես ես։",
    "გამარჯობა მსოფლიო",
    # Arabic, Hebrew, Persian, Urdu
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "يجب فحص الصمام قبل تشغيل المضخة.",
    "שלום עולם, מה שלומך?",
    "سلام دنیا، امروز هوا خوب است.",
    "یہ ایک اردو جملہ ہے۔",
    # Indic, Thai, Khmer, Amharic
    "नमस्ते दुनिया, आप कैसे हैं?",
    "মেশিনটি এখন চালু আছে।",
    "வணக்கம் உலகம்",
    "สวัสดีชาวโลก วันนี้อากาศดีมาก",
    "សួស្តី\u200bពិភពលោក",
    "ሰላም ልዑል",
    # CJK
    "今日はとても良い天気ですね。",
    "この機械は毎日八時間稼働します。",
    "你好，世界！今天天气很好。",
    "请在维修前切断电源。",
    "안녕하세요 세계, 오늘 날씨가 좋네요.",
    "東京タワーは333メートルです。",
    # symbols, code, emoji, odd spacing
    "😀 🚀 ✅ ❤️ — emoji only?",
    "def f(x): return x ** 2  # square",
    "SELECT * FROM sensors WHERE id = 42;",
    "https://example.com/path?query=1&lang=en",
    "user@example.org wrote: >>> quoted text <<<",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\ninside",
    "ALL CAPS SHOUTING TEXT",
    "mIxEd CaSe WoRdS",
    "naïve café résumé coöperate façade",
    "½ ¾ ² ³ µ ß Æ Ø ﬁ ﬂ",
    "1234567890 3.14159 -273.15 1e-9",
    "a-b_c/d\\e|f~g^h",
    "(((nested (parentheses))))",
]

WORDS = [
    "hello", "pump", "valve", "Überprüfung", "naïveté", "東京", "машина", "مرحبا", "שלום", "नमस्ते",
    "ok", "a", "?", "42", "🙂", "ﬁnance", "Ωmega", "x", "supercalifragilisticexpialidocious", "résumé",
]


def parity_sentences(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = list(BASE) + list(WORDS)
    # Pairs joined across languages and scripts.
    for _ in range(80):
        a, b = rng.sample(BASE, 2)
        out.append(f"{a} {b}")
    # Case and punctuation variants.
    for s in rng.sample(BASE, 30):
        out.append(s.lower() if rng.random() < 0.5 else s.upper())
    # Medium (~60-200 tokens) and long (past 256 tokens: truncated by the model).
    for n in (4, 6, 8, 12):
        out.append(" ".join(rng.sample(BASE, n)))
    for n in (20, 25, 30, 40, 60):
        out.append(" ".join(rng.choice(BASE) for _ in range(n)))
    out.append("word " * 300)
    out.append("日本語" * 200)
    out.append(" ".join(rng.choice(WORDS) for _ in range(400)))
    return out


def pad_batch(rows: list[list[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), length), dtype=np.int64)  # 0 = [PAD]
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask


def bucket_for(n: int, buckets=(16, 32, 64, 128, 256)) -> int:
    return next(b for b in buckets if b >= n)
