// fuzz/fuzz_api.cpp — what an HTTP client sends `specactor serve`: the body is parsed as JSON and
// read as a chat request, a completion request and an sglang /generate request; max_tokens is
// checked against a context; each parsed request is answered (a complete response, a chunk, an SSE
// event). The parsers may refuse with server::ApiError only.
#include <string>

#include "fuzz/fuzz_common.hpp"
#include "server/api.hpp"

using namespace specactor;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  fuzz::expect_clean([&] {
    server::json j;
    try {
      j = server::parse_body(body);
    } catch (const server::ApiError& e) {
      if (e.status != 400) std::abort();
      return;
    }
    const server::ApiLimits limits{"smol"};
    for (int which = 0; which < 3; ++which) {
      try {
        server::ApiRequest a = which == 0   ? server::parse_chat(j, limits)
                               : which == 1 ? server::parse_completion(j, limits)
                                            : server::parse_generate(j, limits);
        const auto prompt = static_cast<std::int64_t>(a.request.prompt.size() + a.request.prompt_ids.size());
        a.request.prompt_ids.resize(static_cast<std::size_t>(prompt), 1);
        try {
          sched::check_request(a.request, {4096, 0}, server::api_field_names(a));
        } catch (const sched::RequestError& e) {
          if (server::request_error(e).status != 400) std::abort();
          continue;
        }
        const std::int64_t budget = sched::new_token_budget(a.request, prompt, 4096);
        if (budget < 1 || prompt + budget > 4096) std::abort();
        server::Outcome o;
        o.text = a.request.prompt;
        o.tokens = a.request.prompt_ids;
        o.finish_reason = "stop";
        o.prompt_tokens = prompt;
        (void)server::sse_event(server::chat_chunk("id", 0, "smol", o.text, true, ""));
        (void)server::sse_event(server::completion_response("id", 0, "smol", o));
        (void)server::sse_event(server::generate_response("id", o));
      } catch (const server::ApiError& e) {
        if (e.status != 400 && e.status != 404) std::abort();
        (void)server::error_body(e).dump();
      }
    }
  });
  return 0;
}
