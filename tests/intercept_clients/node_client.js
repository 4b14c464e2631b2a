// A Node client of api.openai.com: node 20's https through the CONNECT tunnel of $HTTPS_PROXY
// (what proxy agents do), trusting the interception CA only through NODE_EXTRA_CA_CERTS.
const http = require("http");
const https = require("https");
const tls = require("tls");

const proxy = new URL(process.env.HTTPS_PROXY);
const headers = {};
if (proxy.username) {
  const user = decodeURIComponent(proxy.username) + ":" + decodeURIComponent(proxy.password);
  headers["Proxy-Authorization"] = "Basic " + Buffer.from(user).toString("base64");
}
const connect = http.request({ host: proxy.hostname, port: proxy.port, method: "CONNECT",
                               path: "api.openai.com:443", headers });
connect.on("connect", (res, socket) => {
  if (res.statusCode !== 200) { console.error("CONNECT answered", res.statusCode); process.exit(2); }
  const body = JSON.stringify({ model: "gpt-4o", max_tokens: 5,
                                messages: [{ role: "user", content: "hello from node" }] });
  const req = https.request({
    host: "api.openai.com", path: "/v1/chat/completions", method: "POST",
    createConnection: () => tls.connect({ socket, servername: "api.openai.com" }),
    headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body),
               authorization: "Bearer " + process.env.TEST_NODE_KEY },
  }, (resp) => {
    resp.resume();
    resp.on("end", () => { console.log("node client:", resp.statusCode); process.exit(resp.statusCode === 200 ? 0 : 1); });
  });
  req.on("error", (err) => { console.error("node client:", err.message); process.exit(1); });
  req.end(body);
});
connect.on("error", (err) => { console.error("node client:", err.message); process.exit(1); });
connect.end();
