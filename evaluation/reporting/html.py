"""report.html: one self-contained static page (no network) with the comparison tables, the
plots and a per-sample browser.

Why the page is built this way: the full MME set times five models is ~12k verdicts, too many
DOM nodes to render at once. The verdicts travel as one JSON blob (strings interned) and a
small vanilla-JS browser filters it and renders one page of cards at a time. Images are small
JPEG thumbnails, embedded once each, up to a total size cap.
"""
from __future__ import annotations

import base64
import html
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .compare import card_key, pairing_notes, sample_shas, tables
from ...utils.errors import ReformError
from ...utils.images import thumbnail_jpeg
from ...utils.predictions import write_text_atomic

#: per family: the per_sample fields offered as filters (field, label)
GROUP_FIELDS: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "accuracy": (("complexity", "complexity"), ("response_type", "response type"),
                 ("feature_group", "feature group")),
    "mme": (("subtask", "subtask"), ("category", "category")),
    "pif": (("turn", "turn"), ("num_instructions", "instructions")),
}
THUMB_SIZE = 112
MAX_THUMB_BYTES = 8 * 1024 * 1024
MAX_IMAGES_PER_SAMPLE = 12


class Thumbnails:
    """Small base64 JPEG thumbnails, one per image file, until the size cap is reached."""

    def __init__(self, max_bytes: int = MAX_THUMB_BYTES) -> None:
        self.index: Dict[str, Optional[int]] = {}
        self.data: List[str] = []
        self.size = 0
        self.max_bytes = max_bytes
        self.skipped = 0

    def add(self, path: str) -> Optional[int]:
        if path in self.index:
            return self.index[path]
        idx: Optional[int] = None
        if self.size < self.max_bytes and os.path.isfile(path):
            try:  # the loaders' pixel guard: an image over the limit is skipped, never decoded
                uri = "data:image/jpeg;base64," + base64.b64encode(thumbnail_jpeg(path, THUMB_SIZE)).decode("ascii")
                self.data.append(uri)
                self.size += len(uri)
                idx = len(self.data) - 1
            except ReformError:
                idx = None
        elif os.path.isfile(path):
            self.skipped += 1
        self.index[path] = idx
        return idx


def image_files(rec: Dict[str, Any], base_dir: str) -> List[str]:
    """The record's image files that exist: ``image_paths`` (relative to the prediction file),
    else ``image_ids`` that are file paths."""
    out = []
    for key in ("image_paths", "image_ids"):
        for p in rec.get(key) or []:
            if not isinstance(p, str) or "#" in os.path.basename(p):
                continue
            full = p if os.path.isabs(p) else os.path.join(base_dir, p)
            if os.path.isfile(full):
                out.append(full)
        if out:
            break
    return out[:MAX_IMAGES_PER_SAMPLE]


class Strings:
    """String interning so repeated prompts/answers travel once."""

    def __init__(self) -> None:
        self.index: Dict[str, int] = {}
        self.items: List[str] = []

    def __call__(self, s: Any) -> int:
        if s is None:
            return -1
        s = s if isinstance(s, str) else json.dumps(s, ensure_ascii=False)
        if s not in self.index:
            self.index[s] = len(self.items)
            self.items.append(s)
        return self.index[s]


def verdict(p: Dict[str, Any], family: str) -> str:
    if family == "pif":
        v = float(p.get("pif", 0.0))
        return "all followed" if v >= 1 - 1e-12 else ("none followed" if v <= 1e-12 else "partly followed")
    if p.get("correct"):
        return "correct"
    if p.get("extracted") is None or p.get("parsed") == "other":
        return "unparsed"
    return "wrong"


def _prompt_text(rec: Dict[str, Any]) -> Any:
    prompt = rec.get("prompt")
    if prompt is None:
        prompt = rec.get("question_with_option") or rec.get("question")
    return prompt


def _response(p: Dict[str, Any], rec: Dict[str, Any]) -> Any:
    """The response as text; a likelihood pick says which candidate won."""
    pred = p.get("prediction", rec.get("prediction"))
    if isinstance(pred, int) and not isinstance(pred, bool):
        cands = rec.get("candidates") or rec.get("answer_options") or []
        text = f" ({cands[pred]})" if 0 <= pred < len(cands) else ""
        return f"candidate {pred}{text}, by likelihood"
    return pred


def sample_data(comp: Dict[str, Any], runs: Sequence[Dict[str, Any]],
                max_thumb_bytes: int = MAX_THUMB_BYTES) -> Dict[str, Any]:
    """The browser's data: models, interned strings, samples (with thumbnails) and verdicts."""
    family = comp["family"]
    fields = [f for f, _ in GROUP_FIELDS[family]]
    strings, thumbs = Strings(), Thumbnails(max_thumb_bytes)
    samples: List[List[Any]] = []
    # a sample is one card per content: two runs that reuse an id for other content get two
    sample_index: Dict[Tuple[str, int, str], int] = {}
    results: List[List[Any]] = []
    present = set()
    for mi, run in enumerate(runs):
        res = run["result"]
        pf = res.get("prediction_file")
        base = os.path.dirname(os.path.abspath(pf)) if pf else os.getcwd()
        by_key = {(str(r.get("sample_id")), int(r.get("dup_index", 0) or 0)): r for r in run.get("records") or []}
        shas = sample_shas(run)
        for p in res["per_sample"]:
            rkey = (str(p["sample_id"]), int(p.get("dup_index", 0) or 0))
            rec = by_key.get(rkey, {})
            key = (*rkey, card_key(shas.get(rkey)))
            if key not in sample_index:
                groups = []
                for f in fields:
                    v = p.get(f)
                    if f == "num_instructions" and v is None and "instructions" in p:
                        v = len(p["instructions"])
                    if v is not None:
                        present.add(f)
                    groups.append(None if v is None else str(v))
                imgs = [thumbs.add(f) for f in image_files(rec, base)]
                sample_index[key] = len(samples)
                # a card shows the options with their marks ("Options: (A) false; (B) true."), so
                # an extracted "B" can be read against them
                question = rec.get("question_with_option") or p.get("question") or rec.get("question")
                samples.append([key[0], key[1], strings(question),
                                strings(p.get("answer_text")), groups, [i for i in imgs if i is not None]])
            checks = [[c["instruction"], bool(c["followed"]), c.get("reason", "")] for c in p.get("checks") or []]
            extracted = p.get("chosen_text") if p.get("chosen_text") is not None else p.get("extracted")
            if family == "mme":
                extracted = p.get("parsed")
            response = _response(p, rec)
            raw = rec.get("prediction")  # the model's own text, when scoring read less of it (--strip_reasoning)
            raw = raw if isinstance(raw, str) and isinstance(response, str) and raw != response else None
            results.append([mi, sample_index[key], strings(_prompt_text(rec)), strings(response),
                            strings(extracted), verdict(p, family),
                            round(float(p["pif"]), 4) if family == "pif" else None, checks, strings(raw)])
    return {"models": [r["name"] for r in runs], "family": family,
            "fields": [[f, lab] for f, lab in GROUP_FIELDS[family] if f in present],
            "field_pos": [fields.index(f) for f, _ in GROUP_FIELDS[family] if f in present],
            "strings": strings.items, "samples": samples, "thumbs": thumbs.data, "results": results,
            "thumbs_skipped": thumbs.skipped}


def _table_html(title: str, header: List[str], rows: List[List[str]]) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (f'<section class="tbl"><h3>{html.escape(title)}</h3><div class="scroll"><table class="report-table">'
            f"<thead><tr>{h}</tr></thead><tbody>{body}</tbody></table></div></section>")


def _plot_html(path: str) -> str:
    with open(path, "rb") as f:
        b64 = base64.b64encode(f.read()).decode("ascii")
    name = os.path.splitext(os.path.basename(path))[0]
    from PIL import Image
    with Image.open(path) as im:
        wide = im.width > 800
    cls = "plot wide" if wide else "plot"
    return (f'<figure class="{cls}"><img alt="{html.escape(name)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{html.escape(name)}</figcaption></figure>")


#: characters that JSON may hold verbatim but HTML or JavaScript would read, written as \uXXXX
#: escapes: no text in the data can end the <script> element, open a comment or end a JS line;
#: lone surrogates (valid JSON, not encodable as UTF-8) are escaped too, so the page can be written
_SCRIPT_UNSAFE_RE = re.compile("[<>&\u2028\u2029\ud800-\udfff]")
_PLACEHOLDER_RE = re.compile(r"\{\{([A-Z]+)\}\}")


def safe_json(obj: Any) -> str:
    """JSON that is inert inside a ``<script>`` element: ``<``, ``>``, ``&``, U+2028 and U+2029
    are escaped, so ``</script>``, ``<!--`` or ``]]>`` in a question cannot end or bend the
    element, and ``JSON.parse`` of the element's text gives back ``obj`` exactly."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return _SCRIPT_UNSAFE_RE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def fill_template(template: str, values: Dict[str, str]) -> str:
    """Replace every ``{{NAME}}`` in one pass, so a value that itself holds ``{{...}}`` (a model
    name, a question) is never substituted again."""
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), template)


def render(comp: Dict[str, Any], runs: Sequence[Dict[str, Any]], plot_files: Sequence[str] = (),
           max_thumb_bytes: int = MAX_THUMB_BYTES) -> str:
    """The whole page as a string."""
    data = sample_data(comp, runs, max_thumb_bytes)
    title = f"{comp['benchmark'] or 'Benchmark'} report: {', '.join(m['name'] for m in comp['models'])}"
    all_tables = tables(comp)
    summary = [t for t in all_tables if t[0].startswith(("Headline", "Operations", "Paired", "Image dependence",
                                                        "Published", "Explanation"))]
    tbls = "".join(_table_html(t, h, r) for t, h, r in summary)
    tbls += "".join(f"<p class='note'>{html.escape(n)}</p>" for n in pairing_notes(comp))
    tbls += "".join(f"<p class='explain'>{html.escape(n)}</p>" for n in (comp.get("explain") or {}).get("notes") or [])
    breakdowns = "".join(_table_html(*t) for t in all_tables if t not in summary)
    plots = "".join(_plot_html(p) for p in plot_files if p.endswith(".png"))
    note = ""
    if data["thumbs_skipped"]:
        note = f"<p class='note'>{data['thumbs_skipped']} image(s) not embedded (thumbnail size cap reached).</p>"
    return fill_template(_TEMPLATE, {"TITLE": html.escape(title), "CI": html.escape(comp["ci"]), "TABLES": tbls,
                                     "BREAKDOWNS": breakdowns or "<p>None.</p>",
                                     "PLOTS": plots or "<p>No plots.</p>", "NOTE": note, "DATA": safe_json(data)})


def write_html(comp: Dict[str, Any], runs: Sequence[Dict[str, Any]], path: str,
               plot_files: Sequence[str] = (), max_thumb_bytes: int = MAX_THUMB_BYTES) -> str:
    """Write report.html atomically; returns its path."""
    write_text_atomic(path, render(comp, runs, plot_files, max_thumb_bytes))
    return path


_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{TITLE}}</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:10px 20px}header h1{font-size:18px;margin:0}
main{padding:10px 20px}.tbl{display:inline-block;vertical-align:top;margin:0 18px 6px 0;max-width:100%}h2{border-bottom:1px solid #ccc;padding-bottom:3px}h3{font-size:14px;margin:14px 0 4px}
.scroll{overflow-x:auto}table.report-table{border-collapse:collapse;background:#fff;font-size:12px}
.report-table th,.report-table td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
.report-table th{background:#eceff1}.report-table td:first-child,.report-table th:first-child{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:10px}.plot{margin:0;background:#fff;border:1px solid #ddd;padding:4px}
.plot img{max-width:520px;display:block}.plot.wide img{max-width:1000px;width:100%}nav{margin:8px 0;font-size:13px}.plot figcaption{font-size:11px;color:#666}
#filters{display:flex;flex-wrap:wrap;gap:8px;align-items:center;background:#fff;border:1px solid #ddd;padding:8px;
position:sticky;top:0;z-index:2}#filters label{font-size:12px;color:#555}
.chips button{border:1px solid #90a4ae;background:#fff;border-radius:12px;padding:2px 9px;margin:1px;cursor:pointer}
.chips button.on{background:#263238;color:#fff}
.card{background:#fff;border:1px solid #ddd;border-left:5px solid #999;margin:8px 0;padding:8px 10px}
.card.correct,.card.all-followed{border-left-color:#2e7d32}.card.wrong,.card.none-followed{border-left-color:#c62828}
.card.unparsed{border-left-color:#ef6c00}.card.partly-followed{border-left-color:#f9a825}
.card .hd{display:flex;gap:10px;flex-wrap:wrap;font-size:12px;color:#555}.card .hd b{color:#222}
.badge{border-radius:3px;padding:0 6px;color:#fff;background:#777}.badge.correct,.badge.all-followed{background:#2e7d32}
.badge.wrong,.badge.none-followed{background:#c62828}.badge.unparsed{background:#ef6c00}.badge.partly-followed{background:#f9a825}
.thumbs img{height:72px;margin:2px;border:1px solid #ccc;image-rendering:auto}
pre{white-space:pre-wrap;word-break:break-word;background:#f5f5f5;padding:5px;margin:3px 0;font-size:12px;max-height:260px;overflow:auto}
.kv{display:grid;grid-template-columns:110px 1fr;gap:2px 8px;font-size:13px}.kv>div:nth-child(odd){color:#666}
.checks td{font-size:12px;padding:1px 6px;border-bottom:1px solid #eee}.ok{color:#2e7d32}.no{color:#c62828}
#pager{margin:8px 0}#pager button{margin-right:6px}.note{color:#a00}
</style></head><body>
<header><h1>{{TITLE}}</h1><div>Confidence intervals: {{CI}}</div></header>
<main>
<nav><a href="#summary">Summary</a> · <a href="#plots">Plots</a> · <a href="#breakdowns">Breakdowns</a> ·
<a href="#samples">Samples</a></nav>
<h2 id="summary">Summary</h2>{{TABLES}}
<h2 id="plots">Plots</h2><div class="plots">{{PLOTS}}</div>
<h2 id="breakdowns">Breakdowns</h2>{{BREAKDOWNS}}
<h2 id="samples">Samples</h2>{{NOTE}}
<div id="filters">
 <span><label>model</label> <span class="chips" id="f-model"></span></span>
 <span><label>verdict</label> <select id="f-verdict"></select></span>
 <span id="f-groups"></span>
 <span><label>search</label> <input id="f-search" type="search" placeholder="id, question, response"></span>
 <span id="count"></span>
</div>
<div id="pager"></div><div id="cards"></div><div id="pager2"></div>
</main>
<script id="report-data" type="application/json">{{DATA}}</script>
<script>
(function(){
"use strict";
var D=JSON.parse(document.getElementById("report-data").textContent);
var S=D.strings, PAGE=25, page=0, shown=[];
var st={models:{}, verdict:"", groups:{}, q:""};
D.models.forEach(function(m,i){st.models[i]=true;});
function str(i){return i<0?"":S[i];}
function el(tag,attrs,kids){var e=document.createElement(tag);if(attrs)for(var k in attrs){
 if(k==="text")e.textContent=attrs[k];else if(k==="cls")e.className=attrs[k];else e.setAttribute(k,attrs[k]);}
 (kids||[]).forEach(function(c){if(c)e.appendChild(c);});return e;}
var chips=document.getElementById("f-model");
D.models.forEach(function(m,i){var b=el("button",{text:m,cls:"on","data-model":i,type:"button"});
 b.addEventListener("click",function(){st.models[i]=!st.models[i];b.className=st.models[i]?"on":"";page=0;apply();});
 chips.appendChild(b);});
var verdicts=[];D.results.forEach(function(r){if(verdicts.indexOf(r[5])<0)verdicts.push(r[5]);});verdicts.sort();
var vs=document.getElementById("f-verdict");vs.appendChild(el("option",{value:"",text:"all"}));
verdicts.forEach(function(v){vs.appendChild(el("option",{value:v,text:v}));});
vs.addEventListener("change",function(){st.verdict=vs.value;page=0;apply();});
var gbox=document.getElementById("f-groups");
D.fields.forEach(function(f,j){var pos=D.field_pos[j],vals=[];
 D.samples.forEach(function(s){var v=s[4][pos];if(v!==null&&vals.indexOf(v)<0)vals.push(v);});
 vals.sort(function(a,b){var x=parseFloat(a),y=parseFloat(b);return(isNaN(x)||isNaN(y))?(a<b?-1:a>b?1:0):x-y;});
 var s=el("select",{id:"f-group-"+f[0]});s.appendChild(el("option",{value:"",text:"all"}));
 vals.forEach(function(v){s.appendChild(el("option",{value:v,text:v}));});
 s.addEventListener("change",function(){st.groups[pos]=s.value;page=0;apply();});
 gbox.appendChild(el("span",null,[el("label",{text:f[1]+" "}),s]));gbox.appendChild(document.createTextNode(" "));});
var search=document.getElementById("f-search"),timer=null;
search.addEventListener("input",function(){clearTimeout(timer);timer=setTimeout(function(){st.q=search.value.toLowerCase();page=0;apply();},150);});
function matches(r){if(!st.models[r[0]])return false;if(st.verdict&&r[5]!==st.verdict)return false;
 var s=D.samples[r[1]];for(var p in st.groups){if(st.groups[p]&&s[4][p]!==st.groups[p])return false;}
 if(st.q){var hay=(s[0]+"\n"+str(s[2])+"\n"+str(r[3])+"\n"+str(r[4])).toLowerCase();if(hay.indexOf(st.q)<0)return false;}
 return true;}
function apply(){shown=[];for(var i=0;i<D.results.length;i++){if(matches(D.results[i]))shown.push(i);}render();}
function pager(id){var p=document.getElementById(id);p.innerHTML="";var n=Math.max(1,Math.ceil(shown.length/PAGE));
 var prev=el("button",{text:"\u2190 prev",type:"button"});prev.disabled=page<=0;
 prev.addEventListener("click",function(){page--;render();});
 var next=el("button",{text:"next \u2192",type:"button"});next.disabled=page>=n-1;
 next.addEventListener("click",function(){page++;render();});
 p.appendChild(prev);p.appendChild(next);p.appendChild(document.createTextNode("page "+(page+1)+" of "+n));}
function kv(k,v,pre){return [el("div",{text:k}),pre?el("div",null,[el("pre",{text:v})]):el("div",{text:v})];}
function card(ri){var r=D.results[ri],s=D.samples[r[1]],cls=r[5].replace(/ /g,"-");
 var hd=el("div",{cls:"hd"},[el("b",{text:D.models[r[0]]}),el("span",{text:s[0]+(s[1]?" (dup "+s[1]+")":"")}),
  el("span",{cls:"badge "+cls,text:r[5]+(r[6]!==null?" \u00b7 PIF "+r[6]:"")})]);
 D.fields.forEach(function(f,j){var v=s[4][D.field_pos[j]];if(v!==null)hd.appendChild(el("span",{text:f[1]+": "+v}));});
 var th=el("div",{cls:"thumbs"});s[5].forEach(function(t){th.appendChild(el("img",{src:D.thumbs[t],alt:"image"}));});
 var prompt=str(r[2]),pr=[el("div",{text:"prompt"}),el("div",null,[el("details",null,[
  el("summary",{text:prompt===str(s[2])?"same as the question":prompt.length+" characters"}),el("pre",{text:prompt})])])];
 var rows=[].concat(kv("question",str(s[2]),true),prompt?pr:[],kv("response",str(r[3]),true),r[8]>=0?kv("raw response",str(r[8]),true):[],
  kv("extracted",str(r[4])),kv("answer",str(s[3])));
 var grid=el("div",{cls:"kv"},rows);var kids=[hd,s[5].length?th:null,grid];
 if(r[7].length){var t=el("table",{cls:"checks"});r[7].forEach(function(c){
  t.appendChild(el("tr",null,[el("td",{text:c[0]}),el("td",{cls:c[1]?"ok":"no",text:c[1]?"followed":"not followed"}),
  el("td",{text:c[2]})]));});kids.push(t);}
 return el("div",{cls:"card "+cls,"data-result":ri},kids);}
function render(){var n=Math.max(1,Math.ceil(shown.length/PAGE));if(page>n-1)page=n-1;if(page<0)page=0;
 var box=document.getElementById("cards");box.innerHTML="";var frag=document.createDocumentFragment();
 shown.slice(page*PAGE,(page+1)*PAGE).forEach(function(i){frag.appendChild(card(i));});box.appendChild(frag);
 document.getElementById("count").textContent=shown.length+" of "+D.results.length+" verdicts";
 pager("pager");pager("pager2");}
window.__report={data:D,state:st,apply:apply,
 selfTest:function(){return {tables:document.querySelectorAll("table.report-table").length,
  plots:Array.prototype.filter.call(document.querySelectorAll(".plot img"),function(i){return i.complete&&i.naturalWidth>0;}).length,
  cards:document.querySelectorAll("#cards .card").length,shown:shown.length,total:D.results.length};}};
apply();
})();
</script></body></html>
"""
