"""A seeded product catalog (the ShoppingBench Products-Finder sandbox) and the keyword index over it.

12,000 products by default: ~400 real product nouns in twelve categories, each product with a brand, colour,
material, size (where the category has sizes), price, rating, title and one-line description. Everything is a
pure function of ``(n, seed)``: building takes about 0.1 s, so the catalog is rebuilt in memory instead of being
cached on disk (nothing under ``cache_dir()`` to go stale). Used by ``agentlab.envs.product_finder``::

    >>> products = catalog()
    >>> len(products) >= 10_000 and products[0]["id"]
    'P00000'
    >>> satisfies(products[0], {"type": products[0]["type"], "max_price": products[0]["price"]})
    True

Debian's ``wordnet-base`` (``/usr/share/wordnet/data.noun``) can add more product nouns with
``build_catalog(wordnet=True)``; the default never reads it, so the catalog is the same on every machine.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from agentlab.types import seeded_rng

N_PRODUCTS = 12_000
TYPES = {  # category -> product types (unique across categories; the "type" constraint matches them exactly)
    "clothing": "t-shirt, polo shirt, dress shirt, flannel shirt, blouse, tank top, hoodie, sweatshirt, "
    "cardigan, sweater, turtleneck, fleece jacket, rain jacket, hiking jacket, denim jacket, bomber jacket, "
    "puffer jacket, parka, trench coat, wool coat, blazer, vest, jeans, chinos, cargo pants, joggers, leggings, "
    "shorts, swim shorts, skirt, dress, jumpsuit, pajamas, bathrobe, scarf, beanie, baseball cap, gloves, socks",
    "footwear": "running shoes, trail shoes, hiking boots, rain boots, snow boots, chelsea boots, ankle boots, "
    "sneakers, loafers, oxford shoes, sandals, flip flops, slippers, espadrilles, clogs, ballet flats, "
    "high heels, work boots, football boots, climbing shoes",
    "furniture": "sofa, loveseat, armchair, recliner, ottoman, coffee table, side table, dining table, desk, "
    "standing desk, office chair, dining chair, bar stool, bench, bookcase, wall shelf, wardrobe, dresser, "
    "nightstand, bed frame, bunk bed, futon, tv stand, shoe rack, coat rack, console table, filing cabinet, "
    "sideboard, display cabinet, rocking chair, folding chair, headboard, vanity table, room divider",
    "kitchen": "frying pan, saucepan, stockpot, dutch oven, wok, skillet, baking sheet, cake pan, muffin tin, "
    "mixing bowl, cutting board, chef knife, bread knife, paring knife, knife block, peeler, grater, whisk, "
    "spatula, ladle, tongs, colander, salad spinner, rolling pin, measuring cups, kitchen scale, teapot, "
    "kettle, french press, coffee grinder, espresso machine, toaster, blender, food processor, stand mixer, "
    "slow cooker, rice cooker, air fryer, water bottle, lunch box, vacuum flask, spice rack",
    "tools": "hammer, screwdriver set, cordless drill, impact driver, circular saw, jigsaw, hand saw, hacksaw, "
    "tape measure, spirit level, utility knife, adjustable wrench, socket set, pliers, wire stripper, "
    "stud finder, workbench, tool box, tool bag, bar clamp, chisel set, orbital sander, angle grinder, heat gun, "
    "glue gun, soldering iron, multimeter, ladder, step stool, work light, sawhorse, nail gun, allen key set, "
    "staple gun",
    "electronics": "headphones, earbuds, bluetooth speaker, soundbar, smartwatch, fitness tracker, tablet, "
    "laptop, monitor, keyboard, mouse, webcam, microphone, power bank, phone charger, usb hub, "
    "external hard drive, memory card, router, smart plug, smart bulb, e-reader, action camera, "
    "digital camera, camera tripod, drone, projector, turntable, radio, alarm clock, gaming controller, "
    "laptop stand, surge protector, hdmi cable, graphics tablet",
    "sports": "yoga mat, dumbbells, kettlebell, resistance bands, jump rope, foam roller, exercise bike, "
    "treadmill, rowing machine, pull-up bar, weight bench, boxing gloves, punching bag, tennis racket, "
    "badminton racket, squash racket, golf clubs, golf bag, basketball, football, volleyball, baseball bat, "
    "hockey stick, skateboard, inline skates, ice skates, ski goggles, ski helmet, bike helmet, road bike, "
    "mountain bike, swim goggles, wetsuit, surfboard, climbing harness, chalk bag",
    "garden": "garden hose, hose reel, watering can, sprinkler, pruning shears, hedge trimmer, lawn mower, "
    "leaf blower, rake, shovel, spade, garden fork, trowel, wheelbarrow, gardening gloves, kneeling pad, "
    "planter, flower pot, raised bed, compost bin, bird feeder, bird bath, garden bench, patio chair, "
    "patio table, sun lounger, parasol, hammock, fire pit, barbecue grill, solar lights, greenhouse",
    "toys": "building blocks, jigsaw puzzle, board game, card game, teddy bear, plush rabbit, doll, dollhouse, "
    "toy car, toy train, remote control car, kite, yo-yo, spinning top, hand puppet, play tent, rocking horse, "
    "wooden blocks, marble run, stacking rings, shape sorter, xylophone, toy drum, water pistol, "
    "bubble machine, sand bucket, science kit, modelling clay, crayons, colouring book, tricycle, scooter, "
    "balance bike",
    "home": "duvet, duvet cover, pillow, pillowcase, bed sheet, fitted sheet, mattress topper, blanket, "
    "throw blanket, bath towel, hand towel, bath mat, shower curtain, curtains, roller blind, rug, doormat, "
    "cushion, table lamp, floor lamp, desk lamp, wall mirror, wall clock, picture frame, vase, candle, "
    "candle holder, laundry basket, storage box, ironing board",
    "bags": "backpack, hiking backpack, daypack, laptop bag, messenger bag, tote bag, duffel bag, suitcase, "
    "carry-on suitcase, garment bag, wallet, purse, handbag, crossbody bag, belt bag, gym bag, cooler bag, "
    "dry bag, toiletry bag, camera bag",
    "camping": "tent, sleeping bag, sleeping pad, camping chair, camping stove, camping table, lantern, "
    "headlamp, flashlight, trekking poles, travel hammock, water filter, compass, binoculars, cool box, "
    "camp cookware set, multitool, fire starter, tarp, bivvy bag",
}
TYPES = {cat: [t.strip() for t in text.split(",")] for cat, text in TYPES.items()}
MATERIALS = {
    "clothing": "cotton, wool, merino wool, linen, polyester, nylon, denim, fleece, cashmere, silk",
    "footwear": "leather, suede, canvas, rubber, mesh, nubuck, wool",
    "furniture": "oak, pine, walnut, beech, teak, steel, rattan, bamboo, velvet, leather",
    "kitchen": "stainless steel, cast iron, ceramic, glass, copper, aluminium, silicone, bamboo, enamel",
    "tools": "steel, carbon steel, aluminium, fibreglass, plastic, titanium, chrome vanadium",
    "electronics": "plastic, aluminium, glass, rubber, carbon fibre, stainless steel",
    "sports": "rubber, foam, neoprene, steel, carbon fibre, aluminium, nylon, leather",
    "garden": "steel, aluminium, plastic, acacia, terracotta, rattan, cast iron, galvanised steel",
    "toys": "wood, plastic, plush, cardboard, felt, rubber, cotton",
    "home": "cotton, linen, wool, polyester, bamboo, ceramic, glass, brass, jute, velvet",
    "bags": "leather, canvas, nylon, polyester, cotton, ripstop nylon",
    "camping": "nylon, ripstop nylon, polyester, aluminium, steel, titanium, silicone",
}
MATERIALS = {cat: [m.strip() for m in text.split(",")] for cat, text in MATERIALS.items()}
SIZES = {"clothing": ["XS", "S", "M", "L", "XL", "XXL"], "footwear": [str(n) for n in range(36, 47)],
         "bags": ["10L", "20L", "30L", "40L", "60L"]}
PRICE_BANDS = {"clothing": (10, 200), "footwear": (25, 220), "furniture": (40, 900), "kitchen": (5, 400),
               "tools": (8, 350), "electronics": (10, 1200), "sports": (8, 900), "garden": (5, 600),
               "toys": (5, 150), "home": (5, 300), "bags": (10, 300), "camping": (8, 400)}
COLOURS = ["black", "white", "grey", "navy", "blue", "red", "green", "olive", "beige", "brown", "pink", "purple",
           "yellow", "orange", "teal", "silver"]
BRANDS = [
    "Northpeak", "Alderway", "Brightfold", "Cobalta", "Duneva", "Elmstead", "Fernhollow", "Granitek",
    "Harbourne", "Ivorya", "Juniperra", "Kestrelle", "Larchmont", "Mistral", "Nordvik", "Oakhurst",
    "Pinegrove", "Quillon", "Redwyn", "Saltmarsh", "Thornbury", "Umbrion", "Valeworth", "Westerly",
    "Yarrowby", "Zephyra", "Ashcombe", "Birchlane", "Corvanta", "Driftmoor", "Embervale", "Foxbridge",
    "Glenhaven", "Hollowell", "Islay", "Jasperton", "Kilnworth", "Lumora", "Moorfield", "Nettlebeck", "Orrin",
    "Pebblestone", "Quarrybrook", "Rowanby", "Stonewick", "Tidewell", "Upland", "Vireo", "Willowmere",
    "Ardentix", "Boltcraft", "Clearwater", "Dovetail", "Everkeen", "Fjordline", "Gullwing", "Hearthly",
    "Ironleaf", "Kindred", "Lodestar"
]
BRANDS_PER_CATEGORY = 14
USES = {  # one of these ends every description; gives search some realistic noise words
    "clothing": ["Comfortable for everyday wear.", "A relaxed fit that layers well.", "Machine washable."],
    "footwear": ["Cushioned sole for all-day comfort.", "Grippy outsole for wet ground.", "True to size."],
    "furniture": ["Easy to assemble at home.", "Sturdy frame for daily use.", "Fits small living rooms."],
    "kitchen": ["Dishwasher safe.", "Made for everyday cooking.", "Easy to clean after use."],
    "tools": ["Built for workshop and site work.", "Comfortable grip for long jobs.", "Comes with a case."],
    "electronics": ["Long battery life.", "Plug and play setup.", "Compact and light for travel."],
    "sports": ["Made for training at home or the gym.", "Durable for regular practice.", "Light and strong."],
    "garden": ["Weatherproof for outdoor use.", "Makes garden work easier.", "Built for years outdoors."],
    "toys": ["Suitable for ages three and up.", "Encourages creative play.", "Safe non-toxic finish."],
    "home": ["Adds warmth to any room.", "Soft and easy to care for.", "A simple modern design."],
    "bags": ["Padded straps for comfort.", "Plenty of pockets for travel.", "Water resistant fabric."],
    "camping": ["Packs small for the trail.", "Light enough for backpacking.", "Tested in wind and rain."],
}
STOPWORDS = {"a", "an", "and", "the", "of", "for", "in", "on", "to", "with", "by", "from", "is", "it", "at", "or",
             "as", "up", "all", "any"}
WORDNET_NOUNS = Path("/usr/share/wordnet/data.noun")
WORDNET_ROOTS = {"clothing": "garment", "footwear": "footwear", "furniture": "furniture",
                 "kitchen": "kitchen_utensil", "tools": "hand_tool", "toys": "toy", "home": "bedclothes"}


def build_catalog(n: int = N_PRODUCTS, seed: int = 0, wordnet: bool = False) -> tuple[dict, ...]:
    """``n`` products, a pure function of ``(n, seed, wordnet)``; ids ``P00000`` … in order."""
    rng = seeded_rng("product-catalog", seed)
    types = {cat: list(ts) for cat, ts in TYPES.items()}
    if wordnet:
        for cat, extra in wordnet_types().items():
            types[cat] += [t for t in extra if t not in types[cat]]
    type_list = [(cat, t) for cat in sorted(types) for t in types[cat]]
    brands = {cat: sorted(rng.sample(BRANDS, BRANDS_PER_CATEGORY)) for cat in sorted(types)}
    base_price = {t: math.exp(rng.uniform(*map(math.log, PRICE_BANDS[cat]))) for cat, t in type_list}
    products = []
    for i in range(n):
        cat, ptype = type_list[i % len(type_list)] if i < len(type_list) else rng.choice(type_list)
        brand, colour, material = rng.choice(brands[cat]), rng.choice(COLOURS), rng.choice(MATERIALS[cat])
        size = rng.choice(SIZES[cat]) if cat in SIZES else ""
        price = max(1.99, round(base_price[ptype] * math.exp(rng.gauss(0, 0.3))) - 0.01)
        rating = round(min(5.0, max(1.0, rng.gauss(4.1, 0.55))), 1)
        title = f"{brand} {colour.title()} {material.title()} {ptype.title()}" + (f", Size {size}" if size else "")
        lead = rng.choice([f"A {colour} {material} {ptype} from {brand}.",
                           f"{brand}'s {ptype} in {colour}, made of {material}."])
        products.append({"id": f"P{i:05d}", "category": cat, "type": ptype, "brand": brand, "colour": colour,
                         "material": material, "size": size, "price": price, "rating": rating, "title": title,
                         "description": f"{lead} {rng.choice(USES[cat])}"})
    return tuple(products)


@lru_cache(maxsize=4)
def catalog(n: int = N_PRODUCTS, seed: int = 0) -> tuple[dict, ...]:
    """The default catalog, built once per process."""
    return build_catalog(n, seed)


def satisfies(product: dict, constraints: dict) -> bool:
    """Whether ``product`` meets every constraint (strings compare case-insensitively; prices ≤, ratings ≥)."""
    for key, want in constraints.items():
        if key == "max_price":
            ok = product["price"] <= want + 1e-9
        elif key == "min_rating":
            ok = product["rating"] >= want - 1e-9
        else:
            ok = str(product.get(key, "")).lower() == str(want).lower()
        if not ok:
            return False
    return True


def terms(text: str) -> list[str]:
    """Search terms: lower-case words minus stop words, with a trailing plural ``s`` dropped ("boots" → "boot").

    >>> terms("The Navy Hiking-Boots, size 42!")
    ['navy', 'hiking', 'boot', 'size', '42']
    """
    out = []
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        if w in STOPWORDS:
            continue
        w = w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
        if w not in out:
            out.append(w)
    return out


class ProductIndex:
    """In-memory inverted index with structured filters, scored with numpy.

    Why not ``agentlab.search.SearchIndex`` (tantivy): its schema stores only ids over title/body, so the
    brand/colour/price/rating filters would mean over-fetching and filtering afterwards, which silently drops
    matches beyond the fetch depth. Here postings are numpy arrays and filters boolean masks: built in ~0.2 s,
    a search is a few vector operations (~0.1 ms p50; a pure-Python dict version took 3–7 ms on queries with
    common words like "size" or colours).
    """

    def __init__(self, products: tuple[dict, ...]):
        import numpy as np

        self.products = products
        self.by_id = {p["id"]: p for p in products}
        postings: dict[str, dict[int, float]] = defaultdict(dict)
        for i, p in enumerate(products):  # a title word weighs twice a description word
            for t, w in ({t: 1.0 for t in terms(p["description"])} | {t: 2.0 for t in terms(p["title"])}).items():
                postings[t][i] = w
        n = len(products)
        self.postings = {t: (np.fromiter(d, int), math.log(1 + n / len(d)) * np.fromiter(d.values(), float))
                         for t, d in postings.items()}
        self.by_field = {}  # field -> value -> boolean mask over products
        for f in ("category", "brand", "colour"):
            values = np.array([p[f].lower() for p in products])
            self.by_field[f] = {v: values == v for v in sorted(set(values.tolist()))}
        self.price = np.array([p["price"] for p in products])
        self.rating = np.array([p["rating"] for p in products])

    def search(self, query: str, k: int = 10, max_price: float = 0, min_rating: float = 0,
               **fields: str) -> tuple[list[dict], int]:
        """Top-``k`` products by idf-weighted term overlap among those passing the filters, and the match count.

        ``fields`` are exact (case-insensitive) ``category``/``brand``/``colour`` filters; empty or 0 means none.
        A query without search words lists the filtered products by rating. Ties break by rating, then id.
        """
        import numpy as np

        words = terms(query)[:32]
        scores = np.zeros(len(self.products))
        for t in words:
            if t in self.postings:
                ids, weights = self.postings[t]
                scores[ids] += weights
        mask = scores > 0 if words else np.ones(len(self.products), bool)
        for f, v in fields.items():
            if v:
                mask &= self.by_field[f].get(v.lower(), False)
        if max_price:
            mask &= self.price <= max_price
        if min_rating:
            mask &= self.rating >= min_rating
        hits = np.flatnonzero(mask)
        if len(hits) > k:  # keep everything tied with the k-th score, so the tie-break below is exact
            hits = hits[scores[hits] >= np.partition(scores[hits], len(hits) - k)[len(hits) - k]]
        top = hits[np.lexsort((hits, -self.rating[hits], -scores[hits]))][:k]
        return [self.products[i] for i in top], int(mask.sum())


@lru_cache(maxsize=4)
def index(n: int = N_PRODUCTS, seed: int = 0) -> ProductIndex:
    return ProductIndex(catalog(n, seed))


def wordnet_types(path: Path = WORDNET_NOUNS, per_category: int = 40) -> dict[str, list[str]]:
    """Extra product nouns from WordNet: hyponyms (two levels) of a root noun per category; ``{}`` if absent."""
    if not path.exists():
        return {}
    synsets: dict[str, tuple[list[str], list[str]]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith(" "):  # licence header
            continue
        fields = line.split(" | ")[0].split()
        n_words = int(fields[3], 16)
        words = [fields[4 + 2 * j].lower() for j in range(n_words)]
        rest = fields[4 + 2 * n_words:]
        hyponyms = [rest[1 + 4 * j + 1] for j in range(int(rest[0])) if rest[1 + 4 * j] == "~"]
        synsets[fields[0]] = (words, hyponyms)
    out: dict[str, list[str]] = {}
    taken = {t for ts in TYPES.values() for t in ts}  # a noun under two roots goes to the first only
    for cat, root in WORDNET_ROOTS.items():
        frontier = [off for off, (words, _) in synsets.items() if root in words]
        found: list[str] = []
        for _ in range(2):
            frontier = [h for off in frontier for h in synsets.get(off, ([], []))[1]]
            for off in frontier:
                for w in synsets.get(off, ([], []))[0]:
                    name = w.replace("_", " ")
                    if re.fullmatch(r"[a-z]+( [a-z]+)?", name) and name not in found:
                        found.append(name)
        out[cat] = sorted(t for t in found if t not in taken)[:per_category]
        taken.update(out[cat])
    return out
