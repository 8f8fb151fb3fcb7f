"""A fixed, varied, English-like sentence corpus for embedding benchmarks (seeded, no downloads)."""

from __future__ import annotations

import json
import random

# Common function words weighted in by repetition, plus content words of every length and a few
# rarer ones that split into several word pieces, so token counts look like real text.
_FUNCTION_WORDS = (
    "the the the a a an of of of to to in in and and and is was for on with as by at from "
    "that this it its be are were has have had not but or which who their they we our you"
)
_CONTENT_WORDS = (
    "time year people way day man woman child world life hand part place case week company "
    "system program question work government number night point home water room mother area "
    "money story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information school face others level office door "
    "health person art war history party result change morning reason research girl guy moment "
    "air teacher force education foot boy age policy music market sense nation plan college "
    "interest death experience effect class control care field development role effort rate "
    "heart drug show leader light voice wife police mind price report decision son view "
    "relationship town road arm difference value building action model season society tax "
    "director position player record paper space ground form event official matter center "
    "couple site project activity star table need court oil situation cost industry figure "
    "street image phone data picture practice piece land product doctor wall patient worker "
    "news test movie north love support technology step baby computer type attention film tree "
    "source organization hair window evidence population site network energy bank kitchen "
    "cat dog river mountain garden engine kernel server request latency throughput cluster "
    "database migration tokenizer embedding vector gradient benchmark pipeline storage "
    "quickly slowly carefully rarely often never always recently finally suddenly quietly "
    "new good high old great big small large national young different long little important "
    "political bad white real best right social only public sure low early able human local "
    "late hard major better economic strong possible whole free military true federal "
    "international full special easy clear recent certain personal open red difficult "
    "available likely short single medical current wrong private past foreign fine common "
    "poor natural significant similar hot dead central happy serious ready simple left "
    "physical general environmental financial blue democratic dark various entire close legal "
    "said made found gave told became left felt brought began kept held wrote stood heard "
    "meant met ran paid sat spoke lay led read grew lost fell sent built understood drew "
    "broke spent cut rose drove bought wore chose sought threw caught dealt won forgot "
    "photosynthesis infrastructure counterintuitive electroencephalography thermodynamics "
    "cryptocurrency bioluminescence interoperability microarchitecture ophthalmologist "
    "Kyoto Reykjavik Ouagadougou Saskatchewan Tegucigalpa Wollongong Mississauga"
)
_FUNCTION = _FUNCTION_WORDS.split()
_CONTENT = _CONTENT_WORDS.split()
_ENDINGS = (".", ".", ".", ".", "?", "!", ";")
_NUMBERS = ("2", "17", "42", "1999", "3.5", "250", "12%", "$40", "7:30", "#9")


def sentences(count: int, seed: int = 1234, min_words: int = 8, max_words: int = 40) -> list[str]:
    """``count`` deterministic sentences of ``min_words``-``max_words`` words each."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = []
        for _ in range(rng.randint(min_words, max_words)):
            roll = rng.random()
            if roll < 0.35:
                words.append(rng.choice(_FUNCTION))
            elif roll < 0.97:
                words.append(rng.choice(_CONTENT))
            else:
                words.append(rng.choice(_NUMBERS))
            if rng.random() < 0.06 and len(words) > 2:
                words[-1] += ","
        words[0] = words[0][:1].upper() + words[0][1:]
        out.append(" ".join(words) + rng.choice(_ENDINGS))
    return out


def embedding_bodies(model: str, texts: list[str]) -> list[bytes]:
    """One ``/v1/embeddings`` request body per text (base64 vectors, the benches' format)."""
    return [
        json.dumps({"model": model, "input": t, "encoding_format": "base64"}).encode()
        for t in texts
    ]
