"""Bilingual word lists for the synthetic catalog. Every entry is "english|中文".

Each domain lists product types, materials (or ingredients / origins), features, and two option
axes: a flat-priced "look" axis (colour, flavour, ...) and a price-varying "size" axis whose
values are ordered from cheapest to dearest. Nothing here is random; `catalog.py` draws from it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Word:
    en: str
    zh: str

    def __call__(self, lang: str) -> str:
        return self.en if lang == "en" else self.zh


def words(spec: str) -> tuple[Word, ...]:
    out = []
    for item in spec.split(","):
        en, zh = item.strip().split("|")
        out.append(Word(en.strip(), zh.strip()))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Domain:
    name: Word
    group: Word  # second level of the category path
    types: tuple[Word, ...]
    materials: tuple[Word, ...]
    features: tuple[Word, ...]
    look_axis: Word
    looks: tuple[Word, ...]
    size_axis: Word
    sizes: tuple[Word, ...]
    price_range: tuple[float, float]  # base price of the smallest size


COLORS = words(
    "black|黑色, white|白色, grey|灰色, red|红色, blue|蓝色, green|绿色, pink|粉色, beige|米色, "
    "navy|藏青色, purple|紫色, yellow|黄色, brown|棕色"
)
COLOR_AXIS = Word("color", "颜色分类")

STYLES = words(
    "modern|现代, classic|经典, minimalist|简约, cute|可爱, vintage|复古, sporty|运动, "
    "business|商务, nordic|北欧, japanese style|日式, luxury|轻奢"
)

# Sub-category variants: a type times a modifier makes a group of near-identical products.
MODIFIERS = words(
    "kids|儿童, travel|旅行, premium|高端, portable|便携式, household|家用, outdoor|户外, "
    "office|办公, mini|迷你, professional|专业, eco-friendly|环保, student|学生, couple|情侣, "
    "elderly|老人, smart|智能, deluxe|豪华"
)

BRAND_SYLLABLES_EN = ("lu", "mi", "ra", "ko", "sa", "ve", "no", "ta", "zen", "qi", "bo", "li", "va", "den")
BRAND_CHARS_ZH = "美佳优乐康意森格雅途星悦睿卓尚品朗博"

DOMAINS: tuple[Domain, ...] = (
    Domain(
        Word("home", "家居"), Word("bedding", "床上用品"),
        words("pillow|枕头, quilt|被子, bed sheet|床单, mattress topper|床垫, blanket|毛毯, "
              "cushion|靠垫, curtain|窗帘, bath towel|浴巾"),
        words("latex|乳胶, cotton|纯棉, linen|亚麻, silk|真丝, memory foam|记忆棉, bamboo fiber|竹纤维"),
        words("breathable|透气, anti-mite|防螨, machine washable|可机洗, neck support|护颈椎, "
              "extra soft|柔软, thickened|加厚, antibacterial|抗菌, hypoallergenic|防过敏"),
        COLOR_AXIS, COLORS,
        Word("size", "尺寸"),
        words("40x60cm|40x60cm, 48x74cm|48x74cm, 150x200cm|150x200cm, 180x220cm|180x220cm, "
              "200x230cm|200x230cm"),
        (29.0, 160.0),
    ),
    Domain(
        Word("kitchen", "厨房用品"), Word("cookware", "厨具"),
        words("frying pan|炒锅, knife set|刀具套装, rice cooker|电饭煲, electric kettle|电水壶, "
              "cutting board|砧板, food container|保鲜盒, blender|料理机, soy milk maker|豆浆机"),
        words("stainless steel|不锈钢, cast iron|铸铁, ceramic|陶瓷, glass|玻璃, bamboo|竹制, tritan|tritan"),
        words("non-stick|不粘, dishwasher safe|可洗碗机, induction ready|电磁炉适用, insulated|保温, "
              "quick heating|快速加热, leak-proof|防漏, large capacity|大容量, low noise|低噪音"),
        COLOR_AXIS, COLORS,
        Word("capacity", "容量"),
        words("0.5l|0.5L, 1l|1L, 1.5l|1.5L, 2l|2L, 3l|3L, 5l|5L"),
        (19.0, 300.0),
    ),
    Domain(
        Word("clothing", "服装"), Word("apparel", "男女装"),
        words("t-shirt|T恤, jacket|夹克, dress|连衣裙, jeans|牛仔裤, hoodie|卫衣, down coat|羽绒服, "
              "shirt|衬衫, sweater|毛衣"),
        words("cotton|纯棉, polyester|涤纶, wool|羊毛, denim|牛仔布, silk|真丝, down|羽绒"),
        words("slim fit|修身, loose fit|宽松, warm|保暖, windproof|防风, wrinkle-free|免烫, "
              "stretchy|弹力, hooded|连帽, long sleeve|长袖"),
        COLOR_AXIS, COLORS,
        Word("size", "尺码"),
        words("s|S, m|M, l|L, xl|XL, xxl|XXL, xxxl|XXXL"),
        (39.0, 600.0),
    ),
    Domain(
        Word("shoes", "鞋靴"), Word("footwear", "鞋类"),
        words("running shoes|跑步鞋, sneakers|板鞋, boots|靴子, sandals|凉鞋, slippers|拖鞋, "
              "loafers|乐福鞋, hiking shoes|登山鞋, canvas shoes|帆布鞋"),
        words("leather|真皮, mesh|网面, canvas|帆布, rubber|橡胶, suede|麂皮, eva foam|EVA"),
        words("non-slip|防滑, lightweight|轻便, waterproof|防水, cushioned|减震, wide fit|宽楦, "
              "slip-on|一脚蹬, wear-resistant|耐磨, breathable|透气"),
        COLOR_AXIS, COLORS,
        Word("shoe size", "鞋码"),
        words("size 36|36码, size 37|37码, size 38|38码, size 39|39码, size 40|40码, size 41|41码, "
              "size 42|42码, size 43|43码, size 44|44码"),
        (49.0, 800.0),
    ),
    Domain(
        Word("electronics", "数码电子"), Word("accessories", "数码配件"),
        words("earphones|耳机, power bank|充电宝, usb flash drive|U盘, smartwatch|智能手表, "
              "bluetooth speaker|蓝牙音箱, keyboard|键盘, mouse|鼠标, phone case|手机壳"),
        words("aluminum alloy|铝合金, abs plastic|ABS塑料, silicone|硅胶, tempered glass|钢化玻璃, "
              "pu leather|PU皮革"),
        words("wireless|无线, noise cancelling|降噪, fast charging|快充, water resistant|防泼溅, "
              "long battery life|长续航, ergonomic|人体工学, rgb backlight|RGB背光, compact|小巧"),
        COLOR_AXIS, COLORS,
        Word("version", "版本"),
        words("lite edition|轻享版, standard edition|标准版, pro edition|专业版, max edition|旗舰版"),
        (29.0, 1500.0),
    ),
    Domain(
        Word("beauty", "美妆护肤"), Word("skin care", "护肤"),
        words("face cream|面霜, lipstick|口红, sunscreen|防晒霜, facial cleanser|洗面奶, serum|精华液, "
              "sheet mask|面膜, shampoo|洗发水, perfume|香水"),
        words("hyaluronic acid|玻尿酸, vitamin c|维生素C, niacinamide|烟酰胺, green tea|绿茶, rose|玫瑰, "
              "aloe vera|芦荟"),
        words("moisturizing|保湿, oil control|控油, brightening|提亮, anti-aging|抗衰老, gentle|温和, "
              "fragrance-free|无香, sweat-proof|防汗, long-lasting|持久"),
        Word("scent", "香型"),
        words("unscented|无香型, floral|花香, citrus|柑橘香, woody|木质香, fresh|清新香, sweet|甜香"),
        Word("volume", "规格"),
        words("30ml|30ml, 50ml|50ml, 100ml|100ml, 200ml|200ml, 500ml|500ml"),
        (19.0, 900.0),
    ),
    Domain(
        Word("food", "食品饮料"), Word("snacks and drinks", "零食饮品"),
        words("green tea|绿茶, coffee beans|咖啡豆, mixed nuts|坚果, honey|蜂蜜, rice|大米, "
              "dark chocolate|黑巧克力, dried mango|芒果干, instant noodles|方便面"),
        words("yunnan|云南, thailand|泰国, northeast china|东北, xinjiang|新疆, japan|日本, "
              "new zealand|新西兰"),
        words("organic|有机, sugar-free|无糖, imported|进口, gift box|礼盒装, low fat|低脂, "
              "fresh|新鲜, roasted|烘焙, individually packed|独立包装"),
        Word("flavor", "口味"),
        words("original|原味, salted|盐焗, spicy|香辣, honey flavor|蜂蜜味, matcha|抹茶味, milk|牛奶味"),
        Word("weight", "重量"),
        words("250g|250g, 500g|500g, 1kg|1kg, 2.5kg|2.5kg, 5kg|5kg"),
        (9.9, 200.0),
    ),
    Domain(
        Word("sports", "运动户外"), Word("outdoor gear", "户外装备"),
        words("yoga mat|瑜伽垫, tent|帐篷, hiking backpack|登山包, dumbbell|哑铃, sports bottle|运动水壶, "
              "sleeping bag|睡袋, jump rope|跳绳, trekking pole|登山杖"),
        words("tpe|TPE, nylon|尼龙, carbon fiber|碳纤维, aluminum alloy|铝合金, polyester|涤纶, neoprene|氯丁橡胶"),
        words("waterproof|防水, foldable|可折叠, ultralight|超轻, non-slip|防滑, adjustable|可调节, "
              "durable|耐用, uv protection|防紫外线, quick setup|速开"),
        COLOR_AXIS, COLORS,
        Word("model", "规格"),
        words("small|小号, medium|中号, large|大号, extra large|特大号"),
        (15.0, 700.0),
    ),
    Domain(
        Word("baby", "母婴用品"), Word("baby care", "婴童用品"),
        words("baby bottle|奶瓶, diapers|纸尿裤, stroller|婴儿推车, baby carrier|婴儿背带, "
              "teether|牙胶, baby wipes|湿巾, sippy cup|儿童水杯, building blocks|积木"),
        words("silicone|硅胶, ppsu|PPSU, glass|玻璃, organic cotton|有机棉, bamboo fiber|竹纤维, abs|ABS"),
        words("bpa-free|无双酚A, anti-colic|防胀气, ultra-thin|超薄, foldable|可折叠, leak-proof|防漏, "
              "soft touch|柔软, unscented|无香, educational|益智"),
        COLOR_AXIS, COLORS,
        Word("stage", "适用阶段"),
        words("newborn|新生儿, 0-6 months|0-6个月, 6-12 months|6-12个月, 1-3 years|1-3岁, 3-6 years|3-6岁"),
        (12.0, 900.0),
    ),
    Domain(
        Word("pets", "宠物用品"), Word("pet supplies", "宠物生活"),
        words("cat litter|猫砂, dog food|狗粮, pet bed|宠物窝, cat tree|猫爬架, dog leash|牵引绳, "
              "pet bowl|宠物碗, cat food|猫粮, chew toy|磨牙玩具"),
        words("tofu|豆腐, bentonite|膨润土, plush|毛绒, stainless steel|不锈钢, nylon|尼龙, chicken|鸡肉"),
        words("dust-free|无尘, clumping|结团, grain-free|无谷, washable|可水洗, deodorizing|除臭, "
              "bite-resistant|耐咬, adjustable|可调节, high protein|高蛋白"),
        COLOR_AXIS, COLORS,
        Word("pack size", "包装规格"),
        words("small pack|小包装, medium pack|中包装, large pack|大包装, family pack|家庭装"),
        (9.0, 400.0),
    ),
    Domain(
        Word("furniture", "办公家具"), Word("home office", "书房办公"),
        words("office chair|办公椅, desk|书桌, bookshelf|书架, monitor stand|显示器支架, desk lamp|台灯, "
              "storage box|收纳箱, shoe rack|鞋架, floor lamp|落地灯"),
        words("solid wood|实木, steel|钢制, mesh fabric|网布, bamboo|竹制, glass|玻璃, pu leather|PU皮"),
        words("height adjustable|可升降, ergonomic|人体工学, easy assembly|易安装, eye care|护眼, "
              "dimmable|可调光, large storage|大容量, foldable|可折叠, sturdy|稳固"),
        COLOR_AXIS, COLORS,
        Word("width", "宽度"),
        words("60cm|60cm, 80cm|80cm, 100cm|100cm, 120cm|120cm, 140cm|140cm"),
        (25.0, 1200.0),
    ),
    Domain(
        Word("appliances", "家用电器"), Word("home appliances", "生活电器"),
        words("air purifier|空气净化器, humidifier|加湿器, vacuum cleaner|吸尘器, electric fan|电风扇, "
              "hair dryer|吹风机, space heater|取暖器, dehumidifier|除湿机, robot vacuum|扫地机器人"),
        words("abs|ABS, stainless steel|不锈钢, aluminum alloy|铝合金, tempered glass|钢化玻璃, pp plastic|PP塑料"),
        words("quiet operation|静音, app control|APP控制, energy saving|节能, remote control|遥控, "
              "timer|定时, cordless|无线, hepa filter|HEPA滤网, large coverage|大面积"),
        COLOR_AXIS, COLORS,
        Word("power", "功率"),
        words("800w|800W, 1200w|1200W, 1600w|1600W, 2000w|2000W, 2200w|2200W"),
        (59.0, 2500.0),
    ),
)

NUM_TYPES = sum(len(d.types) for d in DOMAINS)
