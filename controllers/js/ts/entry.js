const {transform} = require("sucrase");
globalThis.stripTypes = (src, name) => transform(src, {transforms: ["typescript"], disableESTransforms: true, filePath: name, keepUnusedImports: true}).code;
