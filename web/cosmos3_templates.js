// The order of this pack's cards in ComfyUI's Templates dialog.
//
// ComfyUI lists a pack's example_workflows/*.json at /api/workflow_templates in file-system order (a glob), and both
// tested frontends (1.32.9, 1.58.1) show the cards in the order they receive them. This wraps the frontend's own
// request for that listing and sorts this pack's names as template_order.json (written with the thumbnails by
// example_workflows/thumbnails.py) lists them; a name it does not list keeps its place after those it does.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const here = new URL(import.meta.url);
const parts = here.pathname.split("/");
const pack = decodeURIComponent(parts[parts.lastIndexOf("extensions") + 1]); // the pack's folder: the listing's key
const order = fetch(new URL("template_order.json", here)).then((r) => (r.ok ? r.json() : [])).catch(() => []);

const listTemplates = api.getWorkflowTemplates.bind(api);
api.getWorkflowTemplates = async function () {
  const [listing, wanted] = await Promise.all([listTemplates(), order]);
  const names = listing?.[pack];
  if (Array.isArray(names)) {
    const rank = (name) => (wanted.includes(name) ? wanted.indexOf(name) : wanted.length);
    listing[pack] = names.map((name, i) => [rank(name), i, name]).sort((a, b) => a[0] - b[0] || a[1] - b[1])
      .map(([, , name]) => name);
  }
  return listing;
};

app.registerExtension({ name: "Cosmos3.TemplateOrder" });
