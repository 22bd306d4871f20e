/* Tests for the strict JSON reader (c/io/json.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"

#include "check.h"

static mg_json *parse(const char *s, mg_error *err) { return mg_json_parse(s, strlen(s), err); }

/* The document must be rejected, and the message must contain `want`. */
static void expect_error(const char *text, size_t len, const char *want) {
    mg_error err = {{0}};
    mg_json *d = mg_json_parse(text, len, &err);
    CHECK(d == NULL, "accepted invalid JSON '%.40s'", text);
    CHECK(strstr(err.msg, want) != NULL, "for '%.40s' got '%s', want '%s'", text, err.msg, want);
    mg_json_free(d);
}

static void test_scalars(void) {
    mg_error err;
    mg_json *d = parse(" [null, true, false, 0, -0, 12, -3.5, 1e3, 2.5E-2, 1E+2] ", &err);
    CHECK(d != NULL, "%s", err.msg);
    if (!d) return;
    CHECK(mg_json_type_of(d) == MG_JSON_ARRAY && mg_json_len(d) == 10, "array of 10");
    CHECK(mg_json_type_of(mg_json_at(d, 0)) == MG_JSON_NULL, "null");
    CHECK(mg_json_bool(mg_json_at(d, 1)) == 1 && mg_json_bool(mg_json_at(d, 2)) == 0, "bools");
    CHECK(mg_json_is_integer(mg_json_at(d, 3)) && mg_json_int(mg_json_at(d, 3)) == 0, "0");
    CHECK(mg_json_int(mg_json_at(d, 5)) == 12, "12");
    CHECK(mg_json_number(mg_json_at(d, 6)) == -3.5 && !mg_json_is_integer(mg_json_at(d, 6)), "-3.5");
    CHECK(mg_json_number(mg_json_at(d, 7)) == 1000.0 && mg_json_is_integer(mg_json_at(d, 7)), "1e3");
    CHECK(mg_json_number(mg_json_at(d, 8)) == 0.025, "2.5E-2");
    CHECK(mg_json_int(mg_json_at(d, 9)) == 100, "1E+2");
    CHECK(mg_json_at(d, 10) == NULL, "out of range index");
    mg_json_free(d);

    /* Integers beyond 2^53 stay exact; int64 limits convert exactly. */
    d = parse("[9007199254740993, -9223372036854775808, 9223372036854775807, 9223372036854775808]", &err);
    CHECK(d != NULL, "%s", err.msg);
    if (!d) return;
    CHECK(mg_json_int(mg_json_at(d, 0)) == 9007199254740993LL, "2^53+1 exact");
    CHECK(mg_json_int(mg_json_at(d, 1)) == INT64_MIN, "INT64_MIN");
    CHECK(mg_json_int(mg_json_at(d, 2)) == INT64_MAX, "INT64_MAX");
    CHECK(!mg_json_is_integer(mg_json_at(d, 3)), "2^63 is not an exact integer");
    mg_json_free(d);

    d = parse("\"just a string\"", &err);
    CHECK(d && !strcmp(mg_json_string(d), "just a string"), "top-level string");
    mg_json_free(d);
    d = parse("42", &err);
    CHECK(d && mg_json_int(d) == 42, "top-level number");
    mg_json_free(d);
}

static void test_strings(void) {
    mg_error err;
    const char *text =
        "{\"esc\": \"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t\", \"u\": \"\\u00e9\\u4e2d\\ud83d\\ude00\","
        " \"raw\": \"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\", \"nul\": \"a\\u0000b\", \"\": 1}";
    mg_json *d = parse(text, &err);
    CHECK(d != NULL, "%s", err.msg);
    if (!d) return;
    CHECK(!strcmp(mg_json_string(mg_json_get(d, "esc")), "q\" b\\ s/ \b\f\n\r\t"), "escapes");
    CHECK(!strcmp(mg_json_string(mg_json_get(d, "u")), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80"),
          "\\u escapes and surrogate pair to UTF-8: got '%s'", mg_json_string(mg_json_get(d, "u")));
    CHECK(!strcmp(mg_json_string(mg_json_get(d, "raw")), "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80"),
          "raw UTF-8 kept");
    const mg_json *nul = mg_json_get(d, "nul");
    CHECK(mg_json_string_len(nul) == 3 && !memcmp(mg_json_string(nul), "a\0b", 4), "\\u0000 kept with length");
    CHECK(mg_json_int(mg_json_get(d, "")) == 1, "empty key");
    CHECK(mg_json_get(d, "missing") == NULL, "absent key");
    CHECK(mg_json_get(mg_json_get(d, "esc"), "x") == NULL, "get on a non-object");
    CHECK(!strcmp(mg_json_key_at(d, 1), "u") && mg_json_len(d) == 5, "key order kept");
    mg_json_free(d);
}

static void test_big_object(void) {
    /* Many keys: the hashed lookup must find every one, and keys differing only after a
     * NUL must stay distinct. */
    size_t n = 20000, cap = n * 32 + 64, len = 0;
    char *buf = malloc(cap);
    len += (size_t)snprintf(buf + len, cap - len, "{");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s\"model.layers.%zu.w\": [%zu]", i ? "," : "", i, i);
    len += (size_t)snprintf(buf + len, cap - len, "}");
    mg_error err;
    mg_json *d = mg_json_parse(buf, len, &err);
    CHECK(d != NULL, "%s", err.msg);
    if (d) {
        int bad = 0;
        char key[64];
        for (size_t i = 0; i < n; i++) {
            snprintf(key, sizeof key, "model.layers.%zu.w", i);
            const mg_json *v = mg_json_get(d, key);
            if (!v || mg_json_int(mg_json_at(v, 0)) != (int64_t)i) bad++;
        }
        CHECK(bad == 0, "%d keys not found", bad);
        CHECK(mg_json_get(d, "model.layers.20000.w") == NULL, "absent key in big object");
        CHECK(mg_json_len(d) == n, "length");
        mg_json_free(d);
    }
    /* A duplicate at the end of a big object is found too. */
    len -= 1;
    len += (size_t)snprintf(buf + len, cap - len, ",\"model.layers.7.w\": 0}");
    expect_error(buf, len, "duplicate key 'model.layers.7.w'");
    free(buf);
}

static void test_depth(void) {
    char *s = malloc(600);
    for (int depth = 255; depth <= 257; depth++) {
        memset(s, '[', (size_t)depth);
        memset(s + depth, ']', (size_t)depth);
        mg_error err;
        mg_json *d = mg_json_parse(s, (size_t)depth * 2, &err);
        if (depth <= 256) CHECK(d != NULL, "depth %d should parse: %s", depth, err.msg);
        else CHECK(d == NULL && strstr(err.msg, "nesting too deep") && strstr(err.msg, "byte 256"),
                   "depth %d: %s", depth, d ? "accepted" : err.msg);
        mg_json_free(d);
    }
    free(s);
    /* Hostile: a megabyte of '[' and '{"a":' must fail cleanly. */
    size_t n = 1 << 20;
    char *h = malloc(n);
    memset(h, '[', n);
    expect_error(h, n, "nesting too deep");
    for (size_t i = 0; i + 5 <= n; i += 5) memcpy(h + i, "{\"a\":", 5);
    expect_error(h, n - n % 5, "nesting too deep");
    free(h);
}

static void test_errors(void) {
    expect_error("", 0, "byte 0: unexpected end of input");
    expect_error("   ", 3, "byte 3");
    expect_error("[1,]", 4, "byte 3");
    expect_error("{\"a\":1,}", 8, "byte 7: object key");
    expect_error("[01]", 4, "byte 1: leading zero");
    expect_error("[1.]", 4, "decimal point");
    expect_error("[1e]", 4, "exponent");
    expect_error("[-]", 3, "invalid number");
    expect_error("[+1]", 4, "byte 1: unexpected character");
    expect_error("[.5]", 4, "unexpected character");
    expect_error("[NaN]", 5, "unexpected");
    expect_error("[Infinity]", 10, "unexpected");
    expect_error("[1e400]", 7, "out of range");
    expect_error("[tru]", 5, "byte 1");
    expect_error("[nulls]", 7, "byte 5");
    expect_error("\"abc", 4, "byte 0: unterminated string");
    expect_error("\"a\tb\"", 5, "byte 2: control character");
    expect_error("\"\\x\"", 4, "invalid escape");
    expect_error("\"\\u12g4\"", 8, "bad \\u escape");
    expect_error("\"\\ud83d\"", 8, "unpaired high surrogate");
    expect_error("\"\\ud83d\\u0041\"", 14, "unpaired high surrogate");
    expect_error("\"\\ude00\"", 8, "unpaired low surrogate");
    expect_error("\"\xff\"", 3, "byte 1: invalid UTF-8");
    expect_error("\"\xc0\xaf\"", 4, "invalid UTF-8");         /* overlong '/' */
    expect_error("\"\xed\xa0\x80\"", 5, "invalid UTF-8");     /* encoded surrogate */
    expect_error("\"\xe4\xb8\"", 4, "invalid UTF-8");         /* truncated sequence */
    expect_error("{\"a\" 1}", 7, "':' expected");
    expect_error("{1:2}", 5, "object key");
    expect_error("{\"a\":1 \"b\":2}", 13, "',' or '}' expected");
    expect_error("[1 2]", 5, "',' or ']' expected");
    expect_error("{\"a\":1,\"a\":2}", 13, "duplicate key 'a'");
    expect_error("{} {}", 5, "byte 3: unexpected data after");
    expect_error("[1", 2, "unexpected end of input");
    expect_error("[1,2,3", 6, "byte 6");
    const char nul_inside[] = "[1]\0";
    expect_error(nul_inside, sizeof nul_inside - 1, "byte 3");
    expect_error("\xef\xbb\xbf{}", 5, "byte 0"); /* a BOM is not JSON whitespace */
}

int main(void) {
    test_scalars();
    test_strings();
    test_big_object();
    test_depth();
    test_errors();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
