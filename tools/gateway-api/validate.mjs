// Validates Gateway API objects (JSON, one per file) against the Gateway API's own schemas,
// as compiled by @kubernetes-models/gateway-api: one line per invalid file, exit status 1 if any.
//   node tools/gateway-api/validate.mjs route.json ...
import fs from "node:fs";
import { HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute";

const kinds = { "gateway.networking.k8s.io/v1/HTTPRoute": HTTPRoute };
let invalid = 0;
for (const file of process.argv.slice(2)) {
  const object = JSON.parse(fs.readFileSync(file, "utf8"));
  const model = kinds[`${object.apiVersion}/${object.kind}`];
  try {
    if (!model) throw new Error(`no schema for ${object.apiVersion} ${object.kind}`);
    new model(object).validate();
  } catch (error) {
    console.log(`${file}: ${error.message}`);
    invalid += 1;
  }
}
process.exit(invalid ? 1 : 0);
