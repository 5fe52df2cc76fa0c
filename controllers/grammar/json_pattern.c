/* The json controller's pattern.c, compiled into this controller for %json{...} (its sources stay in controllers/json). */
#include "../json/pattern.c"
