"""Real-format loaders on small hand-made files in each schema (ShopSimulator zh, WebShop en)."""

from __future__ import annotations

import gzip
import json
import logging

import pytest

from sim.config import CatalogConfig, EnvConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.loaders import NO_BUDGET, LoaderError, load_items, parse_price_upper
from sim.world import build_world

SEP = "›"


def _opt(value: str, price: float | None = None) -> dict:
    out = {"value": value, "image": "https://img.example/x.jpg"}
    if price is not None:
        out["price"] = price
    return out


def _shopsim_item(asin, title, shop, category, attrs, options, pricing, instruction, simple, goal_atts,
                  goal_opts, persona=None, reason_key=None):
    return {
        "asin": asin, "title": title, "shop_name": shop, "category": category, "query": "",
        "product_category": "", "full_description": title, "pricing": pricing,
        "customization_options": options, "attribute": attrs, "images": [],
        "instructions": [{"instruction": instruction, "instruction_simple": simple, "attributes": goal_atts,
                          "instruction_options": goal_opts}],
        "user_persona": persona, "reason_key": reason_key,
    }


PILLOW = "家居/家纺›床上用品›枕头›乳胶枕"
LIGHT = "五金/工具›照明›户外照明›投光灯"
MILL = "清洗/食品/商业设备›食品加工设备›豆制品加工设备›磨浆机"
PERSONA = {
    "用户ID": "u001",
    "人口属性": {"会员等级": "超级会员", "年龄段": "30-34岁", "性别": "女", "消费层级": "中"},
    "兴趣偏好": {"品牌偏好": [{"品牌名称": "塔拉蕾", "偏好程度": "高"}],
               "商品属性偏好": {"价格区间": {"最小值": 0, "最大值": 150}, "颜色": ["满天星"]}},
    "行为特征": {"最近14天搜索关键词": ["儿童乳胶枕 满天星"]},
    "__reasoning__": "the colour is only in the recent searches",
}


def shopsim_items() -> list[dict]:
    items = []
    for k, (brand, extra) in enumerate([("塔拉蕾", "护颈椎"), ("泰嗨", "透气"), ("梦洁", "防螨"), ("罗莱", "静音"),
                                         ("水星", "抗菌")]):
        items.append(_shopsim_item(
            f"67320876474{k}", f"{brand}泰国进口天然乳胶枕头{extra}枕芯", f"{brand}官方旗舰店", PILLOW,
            ["泰国", "进口", "天然", extra, "枕芯"],
            {"颜色分类": [_opt("满天星", 99.0 + k), _opt("小熊 | 蓝色", 119.0 + k), _opt("粉色", 139.0 + k)]},
            [99.0 + k, 139.0 + k],
            f"想买一个{extra}的泰国天然乳胶枕头，颜色要小熊/蓝色，价格在{150 + 10 * k}元以内。",
            "想买个乳胶枕。", ["天然", extra], ["小熊/蓝色"],
        ))
    for k, watt in enumerate(["50w", "100w", "150w", "200w"]):
        items.append(_shopsim_item(
            f"74784861449{k}", f"LED投光灯{watt}户外防水工地照明灯", f"亮源{k}照明专营店", LIGHT,
            ["led投光灯", "防水", "工地", "照明"],
            {"功率": [_opt(f"【48小时一度电】高亮款{watt}", 40.0 + 20 * k), _opt(f"普通款{watt}", 30.0 + 20 * k)],
             "颜色分类": [_opt("黑色", 40.0 + 20 * k), _opt("白色", 40.0 + 20 * k)]},
            [30.0 + 20 * k, 40.0 + 20 * k],
            f"需要一款{watt}的LED投光灯，工厂工地照明用，要防水，价格在{40 + 20 * k}元左右。",
            "想要个投光灯。", ["led投光灯", "防水", "工地", "照明"], [f"【48小时一度电】高亮款{watt.upper()}"],
        ))
    for k in range(4):
        items.append(_shopsim_item(
            f"5550001000{k}", f"商用不锈钢磨浆机{k + 1}号豆浆米浆一体机", "厨神商用厨具", MILL,
            ["商用", "不锈钢", "磨浆机"], {}, [800.0 + 100 * k],
            f"帮我找台商用不锈钢磨浆机，不超过{900 + 100 * k}元。", "找台磨浆机。", ["商用", "不锈钢"], [],
        ))
    # A persona task: the colour is missing from the vague request and sits in the profile.
    items[0]["user_persona"] = PERSONA
    items[0]["reason_key"] = "行为特征-最近14天搜索关键词"
    # Two axes both vary the price: no single SKU price, so the loader drops it.
    items.append(_shopsim_item(
        "99900000001", "双规格变价乳胶枕", "某店", PILLOW, ["乳胶"],
        {"尺寸": [_opt("40x60cm", 80.0), _opt("50x70cm", 100.0)], "颜色分类": [_opt("白色", 80.0), _opt("灰色", 90.0)]},
        [80.0, 100.0], "想买乳胶枕，价格低于120元。", "乳胶枕", ["乳胶"], ["白色"],
    ))
    # A ranged price no option decides: drawn once per asin, seeded.
    items.append(_shopsim_item(
        "99900000002", "天然乳胶枕经典款", "某某家纺店", PILLOW, ["天然"], {}, [60.0, 90.0],
        "想买个天然乳胶枕，价格在100元左右。", "乳胶枕", ["天然"], [],
    ))
    return items


def webshop_items() -> tuple[list[dict], dict]:
    items = [
        {"asin": "B07HAIR001", "name": "Long Clip-in Hair Extensions Natural Looking 22 inch",
         "full_description": "Soft long clip in hair extensions.", "small_description": ["natural looking", "22 inch"],
         "pricing": "$25.99", "images": [], "category": "beauty", "query": "hair extensions",
         "product_category": "Beauty & Personal Care › Hair Care › Hair Extensions",
         "customization_options": {"Color": [{"value": "Jet Black", "image": None},
                                             {"value": "Dark Brown/Light Brown", "image": None}]}},
        {"asin": "B07HAIR002", "name": "Short Synthetic Hair Extensions Wavy",
         "full_description": "Wavy hair.", "small_description": ["wavy"], "pricing": "$10.00 - $20.00",
         "images": [], "category": "beauty", "query": "hair extensions",
         "product_category": "Beauty & Personal Care › Hair Care › Hair Extensions",
         "customization_options": {"Color": [{"value": "Blonde", "image": None}, {"value": "Red", "image": None}],
                                   "Size": [{"value": "Small", "image": None}, {"value": "Large", "image": None}]}},
        {"asin": "B07SHOE003", "name": "Men's Running Shoes Lightweight Breathable",
         "full_description": "Running shoes.", "small_description": "lightweight", "pricing": "$45.00",
         "images": [], "category": "fashion", "query": "running shoes",
         "product_category": "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
         "customization_options": {"Size": [{"value": "9", "image": None}, {"value": "10", "image": None}]},
         "Attributes": ["lightweight", "breathable", "rubber sole"]},
        {"asin": "B07SHOE004", "name": "Women's Walking Shoes Slip On", "full_description": "", "pricing": "",
         "images": [], "category": "fashion", "query": "walking shoes",
         "product_category": "Clothing, Shoes & Jewelry › Women › Shoes", "customization_options": None},
        {"asin": "B07TEA0005", "name": "Organic Green Tea Bags 100 Count", "full_description": "Green tea.",
         "small_description": [], "pricing": "$1,099.00", "images": [], "category": "grocery", "query": "green tea",
         "product_category": "Grocery & Gourmet Food › Beverages › Tea › Green", "customization_options": {}},
    ]
    human = {
        "B07HAIR001": [
            {"instruction": "i need long clip-in hair extensions which are natural looking, and price lower than "
                            "40.00 dollars", "instruction_attributes": ["natural looking", "long clip"],
             "instruction_options": ["dark brown/light brown"]},
            {"instruction": "i want jet black hair extensions that are 22 inch", "instruction_attributes": ["22 inch"],
             "instruction_options": ["jet black"]},
        ],
        "B07HAIR002": [{"instruction": "i'm looking for wavy blonde hair extensions in size large",
                        "instruction_attributes": ["wavy"], "instruction_options": ["blonde", "large"]}],
        "B07SHOE003": [{"instruction": "lightweight running shoes for men size 10, under $60",
                        "instruction_attributes": ["lightweight"], "instruction_options": ["10"]}],
        "B07TEA0005": [{"instruction": "organic green tea bags", "instruction_attributes": ["organic"],
                        "instruction_options": []}],
        "B0NOTHERE9": [{"instruction": "something not in this file", "instruction_attributes": [],
                        "instruction_options": []}],
    }
    return items, human


def _write(path, obj, *, gz=False):
    data = json.dumps(obj, ensure_ascii=False).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


@pytest.fixture()
def shopsim_path(tmp_path):
    return _write(tmp_path / "items_eval_train.json.gz", shopsim_items(), gz=True)


@pytest.fixture()
def webshop_paths(tmp_path):
    items, human = webshop_items()
    return _write(tmp_path / "items_shuffle_1000.json", items), _write(tmp_path / "items_human_ins.json", human)


# -- ShopSimulator -------------------------------------------------------------------------------


def test_shopsim_fields(shopsim_path, caplog):
    with caplog.at_level(logging.WARNING, logger="sim.loaders"):
        cat = load_items(CatalogConfig(items_path=shopsim_path))
    assert cat.format == "shopsimulator" and cat.lang == "zh"
    assert len(cat) == 14 and len(cat.tasks) == 14  # 15 records, one dropped
    assert cat.stats.dropped_multi_price_axes == 1
    assert "dropped 1 products whose price varies" in caplog.text
    assert cat.index_of("99900000001") is None

    p = cat[cat.index_of("673208764740")]
    assert p.title.startswith("塔拉蕾") and p.shop == "塔拉蕾官方旗舰店" and p.brand == "塔拉蕾"
    assert p.category == ("家居/家纺", "床上用品", "枕头", "乳胶枕")
    assert p.attributes == ("泰国", "进口", "天然", "护颈椎", "枕芯")
    assert [v.value for v in p.options["颜色分类"]] == ["满天星", "小熊 | 蓝色", "粉色"]
    assert p.pricing == (99.0, 139.0) and p.sku_price({"颜色分类": "小熊 | 蓝色"}) == 119.0

    light = cat[cat.index_of("747848614490")]
    # The colour axis does not change the price, so the power axis alone prices the SKU.
    assert light.price_axis == "功率" and all(v.price is None for v in light.options["颜色分类"])
    assert light.sku_price({"功率": "【48小时一度电】高亮款50w", "颜色分类": "白色"}) == 40.0

    t = cat.tasks[0]
    assert t.asin == "673208764740" and t.price_upper == 150.0
    # Goal options arrive un-normalised ('/' and case) and are stored as the product's own value.
    assert dict(t.options) == {"颜色分类": "小熊 | 蓝色"}
    assert t.attributes == ("天然", "护颈椎") and t.product_type == "乳胶枕"
    assert t.is_persona and t.reason_key == "行为特征-最近14天搜索关键词"
    assert "__reasoning__" not in t.user_persona and t.user_persona["用户ID"] == "u001"
    assert t.instruction_sample == t.instruction_simple  # never shipped upstream: the vague request
    assert t.hidden_aspect == "attributes"
    assert not cat.tasks[1].is_persona and cat.tasks[1].instruction_sample is None

    lt = cat.tasks[cat.index_of("747848614490")]
    assert dict(lt.options) == {"功率": "【48小时一度电】高亮款50w"}
    assert lt.price_upper == pytest.approx(44.0)  # "价格在40元左右": about 40


def test_shopsim_ranged_price_drawn_once_and_seeded(shopsim_path):
    a = load_items(CatalogConfig(items_path=shopsim_path))
    b = load_items(CatalogConfig(items_path=shopsim_path))
    c = load_items(CatalogConfig(items_path=shopsim_path, seed=1))
    i = a.index_of("99900000002")
    assert len(a[i].pricing) == 1 and 60.0 <= a[i].pricing[0] <= 90.0
    assert a[i].pricing == b[i].pricing and a[i].pricing != c[i].pricing
    assert a.stats.drawn_prices == 1


@pytest.mark.parametrize("text, expected", [
    ("需要一款50W的LED投光灯，价格在40元左右。", 44.0),
    ("价格低于50元", 50.0),
    ("要一个保温杯，100元以内", 100.0),
    ("不超过 99.5 元", 99.5),
    ("价格在30-50元之间", 50.0),
    ("预算200块", 200.0),
    ("大约￥60", 66.0),
    ("Ａ款，价格１２０元以下", 120.0),
    ("i need long hair extensions, and price lower than 40.00 dollars", 40.0),
    ("running shoes under $60", 60.0),
    ("a desk lamp between $20 and $35", 35.0),
    ("2-3岁儿童枕头，80元左右", 88.0),
    ("50W投光灯，要防水", None),
    ("organic green tea bags", None),
])
def test_price_upper_parsing(text, expected):
    got = parse_price_upper(text)
    assert got == (None if expected is None else pytest.approx(expected))


def test_world_and_episode_on_shopsim(shopsim_path):
    world = build_world(SimConfig(catalog=CatalogConfig(items_path=shopsim_path),
                                  splits=SplitConfig(num_test=2, num_validation=2)))
    assert world.index.num_docs == len(world.catalog)
    for persona in (False, True):
        env = ShopEnv(world, EnvConfig(persona=persona))
        _run_oracle(env, world.catalog, task_id=0)


def _run_oracle(env: ShopEnv, catalog, task_id: int) -> None:
    task = catalog.tasks[task_id]
    env.reset(task_id)
    r = env.step(f"search[{task.instruction}]")
    assert task.asin.lower() in env.available_actions()["clickables"], r.observation
    env.step(f"click[{task.asin.lower()}]")
    product = catalog[catalog.index_of(task.asin)]
    for axis, values in product.options.items():
        env.step(f"click[{task.options.get(axis, values[0].value)}]")
    r = env.step("click[buy now]")
    assert r.done, r.observation
    detail = r.info["reward_detail"]
    assert detail["success"] == 1.0 and detail["correct_product"] == 1.0, detail
    assert r.reward == 1.0


# -- WebShop -------------------------------------------------------------------------------------


def test_webshop_fields(webshop_paths):
    items_path, ins_path = webshop_paths
    cat = load_items(CatalogConfig(items_path=items_path, instructions_path=ins_path))
    assert cat.format == "webshop" and cat.lang == "en"
    assert len(cat) == 5 and len(cat.tasks) == 5
    assert cat.stats.instructions_unknown_asin == 1 and cat.stats.default_prices == 1

    hair = cat[cat.index_of("b07hair001")]  # lookups ignore case (clicks arrive lower-cased)
    assert hair.asin == "B07HAIR001" and hair.pricing == (25.99,)
    assert hair.category == ("Beauty & Personal Care", "Hair Care", "Hair Extensions")
    assert [v.value for v in hair.options["Color"]] == ["jet black", "dark brown | light brown"]
    assert hair.bullets == ("natural looking", "22 inch")
    assert set(hair.attributes) == {"natural looking", "long clip", "22 inch"}  # from the human annotations
    assert cat[cat.index_of("B07SHOE003")].attributes == ("lightweight", "breathable", "rubber sole")
    assert cat[cat.index_of("B07SHOE004")].pricing == (100.0,)  # WebShop's default for a missing price
    assert cat[cat.index_of("B07TEA0005")].pricing == (1099.0,)

    wavy = cat[cat.index_of("B07HAIR002")]
    assert len(wavy.pricing) == 1 and 10.0 <= wavy.pricing[0] <= 20.0  # drawn once per asin

    t0, t1, t2, t3, t4 = cat.tasks
    assert t0.price_upper == 40.0 and dict(t0.options) == {"Color": "dark brown | light brown"}
    assert t0.instruction_simple == "I'm looking for hair extensions."
    # No budget in the text: WebShop's rule, seeded, and the sentence appended so text and goal agree.
    assert t1.price_upper in (30.0, 40.0, 50.0, 60.0)
    assert t1.instruction.endswith(f", and price lower than {t1.price_upper:.2f} dollars")
    assert parse_price_upper(t1.instruction) == t1.price_upper
    assert dict(t2.options) == {"Color": "blonde", "Size": "large"}
    assert t3.price_upper == 60.0 and dict(t3.options) == {"Size": "10"}
    assert t4.price_upper == NO_BUDGET and t4.instruction == "organic green tea bags"  # $1,099: no candidates
    again = load_items(CatalogConfig(items_path=items_path, instructions_path=ins_path))
    assert [t.instruction for t in again.tasks] == [t.instruction for t in cat.tasks]


def test_webshop_finds_instructions_next_to_items(webshop_paths):
    items_path, _ = webshop_paths
    assert len(load_items(CatalogConfig(items_path=items_path)).tasks) == 5


def test_world_and_episode_on_webshop(webshop_paths):
    items_path, ins_path = webshop_paths
    world = build_world(SimConfig(catalog=CatalogConfig(items_path=items_path, instructions_path=ins_path),
                                  splits=SplitConfig(num_test=1, num_validation=1)))
    for task_id in range(len(world.catalog.tasks)):
        _run_oracle(ShopEnv(world), world.catalog, task_id)


# -- malformed input -----------------------------------------------------------------------------


def _load(tmp_path, obj, name="items.json", **kw):
    path = _write(tmp_path / name, obj)
    return load_items(CatalogConfig(items_path=path, **kw))


def test_missing_file(tmp_path):
    with pytest.raises(LoaderError, match="nope.json: cannot read"):
        load_items(CatalogConfig(items_path=str(tmp_path / "nope.json")))


def test_bad_json_names_file_and_record(tmp_path):
    text = json.dumps(shopsim_items()[:3], ensure_ascii=False)
    cut = text.rfind('"title"')
    path = tmp_path / "items_eval_train.json"
    path.write_text(text[:cut] + "{oops" + text[cut:], encoding="utf-8")
    with pytest.raises(LoaderError, match=r"items_eval_train.json: not valid JSON at line 1, column \d+ .* record 2"):
        load_items(CatalogConfig(items_path=str(path)))


def test_truncated_gzip(tmp_path):
    data = gzip.compress(json.dumps(shopsim_items(), ensure_ascii=False).encode())
    path = tmp_path / "items_eval_train.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(LoaderError, match="items_eval_train.json.gz: truncated or corrupt gzip"):
        load_items(CatalogConfig(items_path=str(path)))


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("title"), r"record 3 \(asin 673208764743\): missing required field 'title'"),
    (lambda r: r.pop("pricing"), r"record 3 \(asin 673208764743\): missing required field 'pricing'"),
    (lambda r: r.update(pricing=[1, 2, 3]), r"record 3 .*'pricing' must be \[price\] or \[min, max\]"),
    (lambda r: r.update(pricing=["cheap"]), r"record 3 .*'pricing' must be a number, got 'cheap'"),
    (lambda r: r.update(customization_options={"颜色": "红色"}), r"record 3 .*customization_options\['颜色'\] must be a list"),
    (lambda r: r.update(customization_options={"颜色": [{"image": "x"}]}), r"record 3 .*must be an object with a string 'value'"),
    (lambda r: r.update(instructions=[{"instruction_simple": "x"}]), r"record 3 .*instructions\[0\]: missing required field 'instruction'"),
    (lambda r: r.update(instructions="x"), r"record 3 .*'instructions' must be a list"),
    (lambda r: r.update(user_persona=[1]), r"record 3 .*'user_persona' must be an object or null"),
    (lambda r: r.update(attribute="天然"), r"record 3 .*'attribute' must be a list of strings"),
    (lambda r: r.pop("asin"), r"record 3: missing required field 'asin'"),
])
def test_malformed_shopsim_record(tmp_path, mutate, message):
    items = shopsim_items()
    mutate(items[3])
    with pytest.raises(LoaderError, match=r"items.json: " + message):
        _load(tmp_path, items)


def test_malformed_top_level(tmp_path):
    with pytest.raises(LoaderError, match="expected a JSON list of products"):
        _load(tmp_path, {"asin": "1"})
    with pytest.raises(LoaderError, match="product list is empty"):
        _load(tmp_path, [])
    with pytest.raises(LoaderError, match="neither a ShopSimulator product .* nor a WebShop"):
        _load(tmp_path, [{"asin": "1", "price": 3}])
    with pytest.raises(LoaderError, match="carries its own instructions"):
        _load(tmp_path, shopsim_items(), instructions_path="items_human_ins.json")


def test_malformed_webshop(tmp_path):
    items, human = webshop_items()
    items[2]["pricing"] = "about twelve"
    ins = _write(tmp_path / "ins.json", human)
    with pytest.raises(LoaderError, match=r"items.json: record 2 \(asin B07SHOE003\): 'pricing' 'about twelve'"):
        _load(tmp_path, items, instructions_path=ins)
    items, human = webshop_items()
    human["B07HAIR002"][0].pop("instruction")
    ins = _write(tmp_path / "ins.json", human)
    with pytest.raises(LoaderError, match=r"ins.json: asin B07HAIR002, instruction 0: missing required field 'instruction'"):
        _load(tmp_path, items, instructions_path=ins)
    with pytest.raises(LoaderError, match="tasks live in items_human_ins.json.*set catalog.instructions_path"):
        _load(tmp_path, items, name="items_shuffle.json")
