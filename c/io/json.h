/* A small strict JSON reader (RFC 8259) for safetensors headers, index files and the
 * normalised model config.  Parsed documents are immutable trees. */
#ifndef MG_JSON_H
#define MG_JSON_H

#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

typedef enum mg_json_type {
    MG_JSON_NULL, MG_JSON_BOOL, MG_JSON_NUMBER, MG_JSON_STRING, MG_JSON_ARRAY, MG_JSON_OBJECT
} mg_json_type;

typedef struct mg_json mg_json;

/* Parses text[0..len); on error returns NULL and says where (byte offset) in err. */
mg_json *mg_json_parse(const char *text, size_t len, mg_error *err);
void mg_json_free(mg_json *doc);

mg_json_type mg_json_type_of(const mg_json *v);
const mg_json *mg_json_get(const mg_json *obj, const char *key); /* NULL if absent or not an object */
size_t mg_json_len(const mg_json *v);                            /* array or object entries */
const mg_json *mg_json_at(const mg_json *v, size_t i);           /* array item or object value */
const char *mg_json_key_at(const mg_json *obj, size_t i);
double mg_json_number(const mg_json *v);
int mg_json_is_integer(const mg_json *v);                        /* a number with no fraction */
int64_t mg_json_int(const mg_json *v);
int mg_json_bool(const mg_json *v);
const char *mg_json_string(const mg_json *v);                    /* NUL-terminated, UTF-8 */

/* Added by the loader: length-aware variants (strings may contain "\u0000"). */
const mg_json *mg_json_get_n(const mg_json *obj, const char *key, size_t key_len);
size_t mg_json_key_len_at(const mg_json *obj, size_t i);
size_t mg_json_string_len(const mg_json *v);                    /* bytes, without the NUL */

#endif
