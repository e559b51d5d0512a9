/* Private: the bytes a JSON text (RFC 8259) may not hold, checked before the
 * text goes to cJSON, whose whitespace skipping takes every byte <= 0x20 and
 * whose strings take raw control bytes. Every JSON file mlxdist reads (the
 * ring's hostfile, net/hostfile.c; mlxdist-launch's hostfile of
 * hosts, tools/launch/hosts.c) goes through it. */
#ifndef MLXD_JSON_BYTES_H
#define MLXD_JSON_BYTES_H

#include <stdbool.h>
#include <stddef.h>

/* The first byte of text[0, len) that JSON forbids where it stands: outside a
 * string, a control byte (< 0x20) other than space, tab, line feed and
 * carriage return (the only whitespace JSON has); inside a string, any
 * control byte (JSON requires an escape there). Pure; text need not be
 * NUL-terminated. Returns false when there is none; else true, with *off
 * (may be NULL) the byte's offset and why (may be NULL) = "byte 0x00 at
 * offset 9 (line 1, column 10) is not allowed in JSON (<the rule>)", lines
 * and columns counted from 1. Strings are followed as a lexer would (a '"'
 * opens or closes one, a '\\' in one escapes the next byte), so a file whose
 * string lacks its closing quote is told so at the first line feed. */
bool mlxd_json_bad_byte(const char* text, size_t len, size_t* off, char* why, size_t why_len);

#endif
