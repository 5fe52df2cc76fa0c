/* The json controller's numeric.c, compiled into this controller for %json{...} (its sources stay in controllers/json). */
#include "../json/numeric.c"
