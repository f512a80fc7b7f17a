"""User profiles (个人文档) for persona tasks, in ShopSimulator's field groups.

A persona task hides one requirement from the request; exactly one profile field (named by
`reason_key`, "group-field[-subfield]") carries it. The other fields are plausible filler drawn
from the same pools, so a careless agent can over-read them (a failure the study reports).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.vocab import COLORS, STYLES, Word, words

K = {  # profile keys, "en|zh"
    name: Word(*spec.split("|"))
    for name, spec in {
        "user_id": "user_id|用户ID",
        "tags": "user_tags|用户标签",
        "registered": "registered_at|注册时间",
        "channel": "registration_channel|注册渠道",
        "updated": "last_updated|最后更新时间",
        "tx": "transactions|交易特征",
        "coupon": "coupon_usage_rate|优惠券使用率",
        "repurchase": "repurchase_rate|复购率",
        "aov": "average_order_value|客单价",
        "payment": "payment_preference|支付偏好",
        "promo": "promotion_sensitivity|促销敏感度",
        "spend30": "spend_30d|近30天消费金额",
        "orders90": "orders_90d|近90天订单数",
        "demo": "demographics|人口属性",
        "member": "membership|会员等级",
        "age": "age_band|年龄段",
        "gender": "gender|性别",
        "tier": "spending_tier|消费层级",
        "interests": "interests|兴趣偏好",
        "brands": "brand_preferences|品牌偏好",
        "brand": "brand|品牌名称",
        "level": "level|偏好程度",
        "attrs": "attribute_preferences|商品属性偏好",
        "price_range": "price_range|价格区间",
        "min": "min|最小值",
        "max": "max|最大值",
        "function": "function|功能",
        "size": "size_preference|尺码偏好",
        "material": "material|材质",
        "color": "color|颜色",
        "style": "style|风格",
        "cats": "category_preferences|类目偏好",
        "region": "region|地区信息",
        "province": "province|省份",
        "city": "city|城市",
        "district": "district|区县",
        "tz": "time_zone|时区",
        "behaviour": "behaviour|行为特征",
        "device": "device|常用设备",
        "browse": "daily_browsing_minutes|日均浏览时长",
        "hours": "active_hours|活跃时段",
        "visits": "visits_7d|近7天访问次数",
        "searches": "recent_search_keywords_14d|最近14天搜索关键词",
        "favorites": "favorites_14d|最近14天收藏商品",
        "cart": "cart_14d|最近14天加购商品",
        "shops": "followed_shops_14d|最近14天关注店铺",
    }.items()
}

LEVELS = words("high|高, medium|中, low|低")
PAYMENTS = words("alipay|支付宝, wechat pay|微信支付, credit card|信用卡, huabei|花呗")
MEMBERS = words("regular|普通会员, silver|白银会员, gold|黄金会员, platinum|铂金会员")
AGES = ("18-24", "25-34", "35-44", "45-54", "55+")
GENDERS = words("female|女, male|男")
TIERS = words("budget|经济型, mid-range|中等, premium|高消费")
DEVICES = words("iphone|iPhone, android phone|安卓手机, ipad|iPad, pc|电脑")
CHANNELS = words("app|App, mini program|小程序, web|网页")
PLACES = (
    ("Zhejiang|浙江", "Hangzhou|杭州", "Xihu|西湖区"),
    ("Guangdong|广东", "Shenzhen|深圳", "Nanshan|南山区"),
    ("Sichuan|四川", "Chengdu|成都", "Wuhou|武侯区"),
    ("Jiangsu|江苏", "Nanjing|南京", "Gulou|鼓楼区"),
    ("Beijing|北京", "Beijing|北京", "Haidian|海淀区"),
    ("Shanghai|上海", "Shanghai|上海", "Pudong|浦东新区"),
)


def reason_key(lang: str, *path: str) -> str:
    return "-".join(K[p](lang) for p in path)


def make_profile(
    rng: np.random.Generator,
    lang: str,
    *,
    product_type: str,
    category: str,
    brand: str,
    shop: str,
    hidden_path: tuple[str, ...],
    hidden_value: Any,
    filler: dict[str, list[str]],
) -> dict[str, Any]:
    """A profile whose field at `hidden_path` holds `hidden_value`; the rest is filler.

    `filler` holds pools for the preference fields ('function', 'material', 'size') taken from the
    task's domain, so filler looks real.
    """
    t = lambda key: K[key](lang)  # noqa: E731
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    w = lambda word: word(lang)  # noqa: E731
    place = [Word(*s.split("|"))(lang) for s in pick(PLACES)]
    lo = float(rng.integers(1, 20) * 10)
    profile: dict[str, Any] = {
        t("user_id"): f"u{int(rng.integers(10**7, 10**8))}",
        t("tags"): [w(pick(TIERS)), w(pick(LEVELS))],
        t("registered"): f"20{int(rng.integers(15, 24))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}",
        t("channel"): w(pick(CHANNELS)),
        t("updated"): "2025-06-30",
        t("tx"): {
            t("coupon"): f"{int(rng.integers(5, 90))}%",
            t("repurchase"): f"{int(rng.integers(5, 70))}%",
            t("aov"): round(float(rng.uniform(40, 600)), 1),
            t("payment"): w(pick(PAYMENTS)),
            t("promo"): w(pick(LEVELS)),
            t("spend30"): round(float(rng.uniform(50, 5000)), 1),
            t("orders90"): int(rng.integers(1, 60)),
        },
        t("demo"): {
            t("member"): w(pick(MEMBERS)),
            t("age"): pick(AGES),
            t("gender"): w(pick(GENDERS)),
            t("tier"): w(pick(TIERS)),
        },
        t("interests"): {
            t("brands"): [{t("brand"): brand, t("level"): w(LEVELS[0])}],
            t("attrs"): {
                t("price_range"): {t("min"): lo, t("max"): lo * float(rng.integers(2, 10))},
                t("function"): [pick(filler["function"])],
                t("size"): pick(filler["size"]) if filler["size"] else "",
                t("material"): [pick(filler["material"])],
                t("color"): [w(pick(COLORS))],
                t("style"): [w(pick(STYLES))],
            },
            t("cats"): {category: w(LEVELS[0])},
        },
        t("region"): {t("province"): place[0], t("city"): place[1], t("district"): place[2], t("tz"): "UTC+8"},
        t("behaviour"): {
            t("device"): w(pick(DEVICES)),
            t("browse"): int(rng.integers(5, 180)),
            t("hours"): pick(("08:00-10:00", "12:00-14:00", "20:00-23:00")),
            t("visits"): int(rng.integers(1, 40)),
            t("searches"): [product_type],
            t("favorites"): [],
            t("cart"): [],
            t("shops"): [shop],
        },
    }
    node = profile
    for key in hidden_path[:-1]:
        node = node[t(key)]
    node[t(hidden_path[-1])] = hidden_value
    return profile
