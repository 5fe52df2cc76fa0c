/* The json controller's lencount.c, compiled into this controller (its sources stay in controllers/json). */
#include "../json/lencount.c"
