// Parse Mermaid diagrams with the real Mermaid parser: a JSON array of texts on stdin, a JSON array
// of results on stdout (null when a text parses, else the parser's first error line).
// Mermaid expects a browser; jsdom gives it a window without one.
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!DOCTYPE html><body></body>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import("mermaid");
mermaid.initialize({ startOnLoad: false });

let input = "";
for await (const chunk of process.stdin) input += chunk;
const results = [];
for (const text of JSON.parse(input)) {
  try {
    const parsed = await mermaid.parse(text);
    results.push(parsed.diagramType === "flowchart-v2" ? null : `type ${parsed.diagramType}`);
  } catch (error) {
    results.push(String(error.message || error).split("\n").slice(0, 4).join(" / "));
  }
}
process.stdout.write(JSON.stringify(results));
